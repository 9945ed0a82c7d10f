//! Skipped tests, made visible: libtest has no "skipped" outcome and captures a passing test's
//! output, so a skip writes its notice straight to the terminal's stderr (past the capture) and
//! appends it to `target/tmp/skipped-tests.log`, which counts the skips of every run.

use std::io::Write;

/// Records that the calling test skips part of itself, and why.
pub fn skipped(reason: &str) {
    let line = format!("SKIPPED: {reason}\n");
    // `std::io::stderr()` writes to fd 2 directly; only the print macros are captured.
    let _ = std::io::stderr().write_all(line.as_bytes());
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.log");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = file.write_all(line.as_bytes());
    }
}
