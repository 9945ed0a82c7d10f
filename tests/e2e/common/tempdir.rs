//! Private scratch directories: one per test (or benchmark run), with a `policies/` directory
//! beside the config file as infergate expects, removed with everything in it on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir {
    /// Absolute path of the directory.
    pub path: PathBuf,
}

impl TempDir {
    /// Creates `infergate-<tag>-<pid>-<nanos>-<n>` under `std::env::temp_dir()`, with an empty
    /// `policies/` inside.
    pub fn new(tag: &str) -> TempDir {
        // The sequence number keeps directories apart within one process, the pid and the time
        // across processes and runs.
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("infergate-{tag}-{}-{nanos}-{n}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(path.join("policies")).expect("create temp dir");
        TempDir { path }
    }

    /// `DIR/infergate.yaml`.
    pub fn config(&self) -> PathBuf {
        self.path.join("infergate.yaml")
    }

    /// `DIR/policies/routing.yaml`.
    pub fn routing(&self) -> PathBuf {
        self.path.join("policies").join("routing.yaml")
    }

    /// Writes the config file (atomically: a temp file renamed over it, as editors do).
    pub fn write_config(&self, text: &str) {
        write_atomic(&self.config(), text);
    }

    /// Writes `policies/routing.yaml` atomically.
    pub fn write_routing(&self, text: &str) {
        write_atomic(&self.routing(), text);
    }

    /// Writes `text` to `name` (a relative path, directories created) and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create a subdirectory of the temp dir");
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Replaces `path` with `text` in one rename, so a watcher never reads a half-written file.
pub fn write_atomic(path: &Path, text: &str) {
    let name = path.file_name().expect("file name").to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write temp file");
    std::fs::rename(&tmp, path).expect("rename over the file");
}
