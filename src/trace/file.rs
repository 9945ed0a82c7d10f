//! The trace file: JSON lines appended to `path`; past `max_bytes` it is renamed `path.1` (the
//! older ones shifting to `path.2` ... `path.<keep>`, the oldest deleted) and a new one begun,
//! so the files never hold more than about `(keep + 1) × max_bytes`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// An append-only file rotated by size.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens (or creates) `path` for appending.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep,
            file,
            size,
        })
    }

    /// Appends `line` and a newline, rotating first when it would pass `max_bytes` (a file
    /// always takes at least one line, however long).
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        let len = line.len() as u64 + 1;
        if self.size > 0 && self.size + len > self.max_bytes {
            self.rotate()?;
        }
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.file.write_all(&buf)?;
        self.size += len;
        Ok(())
    }

    /// Flushes what was written to the OS.
    pub fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    /// `path.<i>` (the i-th older file).
    fn older(&self, i: u32) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{i}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            // Oldest first, so no rename overwrites a file still to be moved.
            let _ = std::fs::remove_file(self.older(self.keep));
            for i in (1..self.keep).rev() {
                let from = self.older(i);
                if from.exists() {
                    std::fs::rename(&from, self.older(i + 1))?;
                }
            }
            std::fs::rename(&self.path, self.older(1))?;
        }
        self.file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A fresh directory for one test.
    pub(crate) fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("infergate-trace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn lines(p: &Path) -> Vec<String> {
        std::fs::read_to_string(p)
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    #[test]
    fn files_rotate_by_size_and_keep_n() {
        let path = scratch("rotate").join("t/trace.jsonl");
        let mut f = RotatingFile::open(&path, 20, 2).unwrap();
        for i in 0..10 {
            // 10 bytes a line: two per file.
            f.write_line(&format!("line-{i:04}")).unwrap();
        }
        f.flush().unwrap();
        assert_eq!(lines(&path), ["line-0008", "line-0009"]);
        assert_eq!(lines(&f.older(1)), ["line-0006", "line-0007"]);
        assert_eq!(lines(&f.older(2)), ["line-0004", "line-0005"]);
        assert!(!f.older(3).exists(), "only `keep` older files");
        // Reopened, it appends to what is there.
        drop(f);
        let mut f = RotatingFile::open(&path, 40, 2).unwrap();
        f.write_line("line-0010").unwrap();
        assert_eq!(lines(&path).len(), 3);
    }

    #[test]
    fn keep_zero_keeps_only_the_live_file_and_long_lines_still_go() {
        let path = scratch("keep0").join("trace.jsonl");
        let mut f = RotatingFile::open(&path, 5, 0).unwrap();
        f.write_line("a long line").unwrap();
        f.write_line("another long line").unwrap();
        assert_eq!(lines(&path), ["another long line"]);
        assert!(!f.older(1).exists());
    }
}
