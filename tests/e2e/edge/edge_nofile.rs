//! Edge hardening, file descriptors: the gateway raises its open-file soft limit to the hard limit
//! at start, and when even the hard limit runs out, `accept()` errors back off instead of spinning
//! and the gateway serves again as soon as descriptors free up. One test in its own binary: it
//! lowers this test process's own soft limit for a moment, which the gateway inherits.

use crate::common;

use std::time::{Duration, Instant};

use common::gateway::{Gateway, TempDir, config_yaml, eventually, routing_yaml};
use common::{Engine, get};
use hyper::StatusCode;
use rlimit::Resource;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The gateway's `Max open files` soft and hard limits, from `/proc/PID/limits`.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// CPU seconds (user + system) the process has used, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the `(comm)`: state is field 3, utime 14 and stime 15.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::test]
async fn the_open_file_limit_is_raised_and_running_out_of_descriptors_backs_off() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("edge-nofile");
    dir.write_config(&config_yaml(&[&engine.url], ""));
    dir.write_routing(&routing_yaml("round_robin", &[]));

    // Started with a soft limit of 256 (the hard one unchanged), the gateway raises it.
    let (soft, hard) = Resource::NOFILE.get().expect("getrlimit");
    assert!(
        hard > 1024,
        "this test needs a hard open-file limit above 1024, not {hard}"
    );
    Resource::NOFILE
        .set(256, hard)
        .expect("lower the soft limit");
    let gw = Gateway::start(&dir.config(), &[]).await;
    Resource::NOFILE
        .set(soft, hard)
        .expect("restore the soft limit");
    assert_eq!(open_file_limits(gw.pid), (hard, hard));
    let log = gw.stderr();
    assert!(log.contains("raised the open-file soft limit"), "{log}");

    // Now take descriptors away for real: a soft limit of 64 (it raises only at start), and
    // 200 connections at once.
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &gw.pid.to_string(), &format!("--nofile=64:{hard}")])
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit failed: {status}");
    let before = cpu_seconds(gw.pid);
    let started = Instant::now();
    let mut flood = Vec::new();
    for _ in 0..200 {
        // The kernel completes the handshake from its backlog even when accept() fails.
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(gw.addr)).await
        {
            flood.push(s);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = (cpu_seconds(gw.pid) - before) / started.elapsed().as_secs_f64();
    // A hot accept() loop burns a whole core; backing off costs next to nothing.
    assert!(cpu < 0.5, "the gateway used {:.0}% of a core", cpu * 100.0);

    // Descriptors come back: the gateway serves again, within its longest back-off.
    drop(flood);
    let status = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &gw.pid.to_string(),
            &format!("--nofile={hard}:{hard}"),
        ])
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit failed: {status}");
    eventually(
        "/healthz answers again",
        Duration::from_secs(10),
        || async {
            let probe = tokio::time::timeout(Duration::from_secs(1), get(&gw.at("/healthz"))).await;
            matches!(probe, Ok((StatusCode::OK, _))).then_some(())
        },
    )
    .await;
    let errors = gw.metric("infergate_accept_errors_total").await;
    assert!(errors >= 1.0, "no accept error counted");

    // And it is not stuck at the old limit: 600 connections at once are all answered.
    let mut conns = Vec::new();
    for _ in 0..600 {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(
            &mut s,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .expect("write");
        conns.push(s);
    }
    for mut s in conns {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "a connection got no answer");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
}
