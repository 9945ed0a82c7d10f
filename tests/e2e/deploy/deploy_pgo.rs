//! The profile-guided build's training run (deploy/pgo/train.sh) works on this build: it starts
//! `infergate up` on the shipped config and policies, streams two shipped workloads through
//! `infergate bench` and sends non-streaming chat requests through curl, and every one is
//! answered. A training run that mostly trained refusals or errors would optimize the wrong
//! paths, so the script fails on it, and this test fails with it. (The instrumented and optimized
//! builds of deploy/pgo/build.sh take two release builds: BENCHMARKS.md reports them, not CI.)

use std::path::Path;
use std::process::Command;

#[test]
fn the_training_run_serves_every_request_it_sends() {
    let script = Path::new(crate::common::REPO).join("deploy/pgo/train.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_infergate"))
        // Small and slow: it runs beside latency-sensitive tests (the doctor's scenarios).
        .env("NONSTREAM", "40")
        .env("BENCH_SECONDS", "3")
        .env("BENCH_RATE", "8")
        .env("PARALLEL", "2")
        .output()
        .expect("run deploy/pgo/train.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "train.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for workload in ["chat", "shared-system-prompt"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("streaming {workload}: ")))
            .unwrap_or_else(|| panic!("no line for {workload}:\n{stdout}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        // "streaming NAME: OK of SENT answered 2xx"
        let (ok, sent) = (words[2], words[4]);
        assert_eq!(ok, sent, "{line}");
        assert!(sent.parse::<u64>().unwrap_or(0) > 0, "{line}");
    }
    assert!(
        stdout.contains("non-streaming: 40 of 40 answered 200"),
        "{stdout}"
    );
}
