//! Configuration errors, each with its file and (when known) line and column, and the sink that
//! collects them so one validation pass can report every problem at once.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::{DefaultMessageFormatter, Location, MessageFormatter};

/// One problem in one configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The file at fault, as given to the loader.
    pub file: PathBuf,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<u64>,
    /// 1-based column, when known.
    pub column: Option<u64>,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl ConfigError {
    /// An error about the file as a whole (unreadable, missing).
    pub fn file(file: &Path, message: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            line: None,
            column: None,
            message: message.into(),
        }
    }

    /// An error at a place in the file; an unknown location gives a file-level error.
    pub fn at(file: &Path, location: &Location, message: impl Into<String>) -> Self {
        let known = |n: u64| (n > 0).then_some(n);
        Self {
            file: file.to_path_buf(),
            line: known(location.line()),
            column: known(location.column()),
            message: message.into(),
        }
    }

    /// A YAML syntax or schema error from serde-saphyr, keeping its line and column.
    pub fn yaml(file: &Path, err: &serde_saphyr::Error) -> Self {
        let inner = err.without_snippet();
        let message = DefaultMessageFormatter.format_message(inner).into_owned();
        match inner.location() {
            Some(location) => Self::at(file, &location, message),
            None => Self::file(file, message),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one load, in file order then line order.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{err}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects errors for one file during validation.
pub struct Sink<'a> {
    file: &'a Path,
    errors: Vec<ConfigError>,
}

impl<'a> Sink<'a> {
    /// An empty sink for `file`.
    pub fn new(file: &'a Path) -> Self {
        Self {
            file,
            errors: Vec::new(),
        }
    }

    /// Records a problem at `location`.
    pub fn at(&mut self, location: &Location, message: impl Into<String>) {
        self.errors
            .push(ConfigError::at(self.file, location, message));
    }

    /// Records a problem with no place in the file.
    pub fn whole(&mut self, message: impl Into<String>) {
        self.errors.push(ConfigError::file(self.file, message));
    }

    /// Records a YAML parse error.
    pub fn yaml(&mut self, err: &serde_saphyr::Error) {
        self.errors.push(ConfigError::yaml(self.file, err));
    }

    /// The errors, sorted by line then column (file-level errors first).
    pub fn into_sorted(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|e| (e.line, e.column));
        self.errors
    }
}
