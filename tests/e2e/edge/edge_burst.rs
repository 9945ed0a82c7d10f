//! Edge hardening, a burst: 10,000 client connections open at once against `infergate up`, each
//! sending one chat request. Every one gets an HTTP answer, and only 200, 429 or 503 (admitted,
//! queue full, or shed); the admin listener's `/healthz` keeps answering within a second
//! throughout. The clients
//! come from four loopback addresses, as from four hosts (one address would hit the per-IP cap).

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::gateway::{Gateway, MODEL, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const CONNECTIONS: usize = 10_000;
const SOURCES: u8 = 4;

/// Connects to `to` from `127.0.0.<host>`.
async fn connect_from(host: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)),
        0,
    ))?;
    socket.connect(to).await
}

/// Sends `request` on a fresh connection from `127.0.0.<host>`; the status code, or why none.
async fn exchange(host: u8, to: SocketAddr, request: Arc<Vec<u8>>) -> Result<u16, String> {
    let mut s = connect_from(host, to)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(&request)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {:?}", &text[..text.len().min(200)]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_at_once_get_only_200_429_or_503_and_healthz_stays_fast() {
    // This process holds every client socket: raise its own soft limit as the gateway does.
    let (soft, hard) = rlimit::Resource::NOFILE.get().expect("getrlimit");
    if soft < hard {
        rlimit::Resource::NOFILE
            .set(hard, hard)
            .expect("raise the soft limit");
    }
    assert!(
        hard > CONNECTIONS as u64 + 1_000,
        "this test needs an open-file hard limit above {}, not {hard}",
        CONNECTIONS + 1_000
    );
    let dir = TempDir::new("edge-burst");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\nadmin: {{listen: \"127.0.0.1:0\"}}\npolicies: policies\n\
         log: {{level: warn}}\n\
         models:\n  - {{name: {MODEL}, pool: local}}\n\
         pools:\n  - name: local\n    dialect: infergate\n    workers:\n      \
         - spawn: {{count: 2, args: [\"--backend\", \"sim\", \"--gpu\", \"h100\", \"--model\", \"{MODEL}\"]}}\n    \
         admission: {{max_in_flight_per_worker: 64, max_queue: 512, max_wait: 5s}}\n"
    ));
    dir.write_routing("pools:\n  local: {policy: least_load}\n");
    let gw = Gateway::up(Some(&dir.config())).await;
    let key = gw.api_key.clone().expect("demo key");
    let body = format!(
        "{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\"max_tokens\":4}}"
    );
    let request = Arc::new(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    );
    let healthz =
        Arc::new(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec());

    // /healthz every 100 ms from a fifth address, for as long as the burst runs.
    let done = Arc::new(AtomicBool::new(false));
    // The probes go where a kubelet's would: the admin listener, which runs on its own thread.
    // The prober has its own thread and runtime too, so what it measures is the gateway, not
    // this process's scheduler busy with 10,000 client tasks.
    let admin: SocketAddr = gw
        .admin
        .trim_start_matches("http://")
        .parse()
        .expect("admin address");
    let probe = {
        let (done, healthz, addr) = (done.clone(), healthz.clone(), admin);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("prober runtime");
            rt.block_on(async move {
                let mut slowest = Duration::ZERO;
                let mut failures = Vec::new();
                let mut probes = 0u32;
                while !done.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let answer = tokio::time::timeout(
                        Duration::from_secs(5),
                        exchange(SOURCES + 1, addr, healthz.clone()),
                    )
                    .await;
                    if !matches!(answer, Ok(Ok(200))) {
                        failures.push(format!("{answer:?}"));
                    }
                    slowest = slowest.max(started.elapsed());
                    probes += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (slowest, probes, failures)
            })
        })
    };

    let started = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let (request, addr) = (request.clone(), gw.addr);
            let host = 1 + (i % usize::from(SOURCES)) as u8;
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(90), exchange(host, addr, request))
                    .await
                    .unwrap_or_else(|_| Err("no answer within 90 s".into()))
            })
        })
        .collect();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    let mut failures = Vec::new();
    for t in tasks {
        match t.await.expect("client task") {
            Ok(code) => *by_status.entry(code).or_default() += 1,
            Err(e) => failures.push(e),
        }
    }
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let (slowest, probes, probe_failures) = probe.join().expect("prober thread");
    assert!(
        probe_failures.is_empty(),
        "/healthz during the burst: {probe_failures:?}"
    );
    eprintln!(
        "{CONNECTIONS} connections in {took:?}: {by_status:?}; /healthz slowest {slowest:?} of {probes}"
    );
    assert!(
        failures.is_empty(),
        "{} connections got no HTTP answer, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let unexpected: Vec<_> = by_status
        .keys()
        .filter(|c| ![200, 429, 503].contains(*c))
        .collect();
    assert!(unexpected.is_empty(), "statuses {by_status:?}");
    assert!(
        by_status.get(&200).copied().unwrap_or(0) > 0,
        "{by_status:?}"
    );
    assert!(probes >= 3, "only {probes} /healthz probes ran");
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?}"
    );
}
