//! The fleet's usage ledger on a real PostgreSQL (Debian's `postgresql`: a fresh cluster made by
//! `initdb` in a temp dir, `postgres` started on a free port and killed by PID): two
//! `infergate gateway` replicas write their own batches into one database and both read the same
//! totals, rollup and rows back; a PostgreSQL crash mid-run never holds up a request, and loses
//! at most the rows whose flush it interrupted, each counted.

use crate::common;
use crate::tenant_support;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use tenant_support::{Gw, Setup, TempDir, completion, key_of, post, usage_by_tenant, wait_rows};
use tokio::task::JoinSet;

use common::Engine;

const PRICES: &str =
    "version: 1\nmodels:\n  llama-3-8b: {input: 2.0, cached_input: 0.5, output: 8.0}\n";
const TIERS: &str = "tiers:\n  full: {priority: 1}\n";
const TENANTS: [(&str, &str); 2] = [("acme", "full"), ("globex", "full")];
/// The database role `initdb` creates (trusted, no password) and the database the ledger uses.
const PG_USER: &str = "infergate";
const PG_DB: &str = "ledger";

/// Debian's PostgreSQL server binaries: the newest `/usr/lib/postgresql/N/bin` with `initdb`
/// and `postgres`. Fails (never skips) when there is none.
fn pg_bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): install Debian's \
             postgresql (`apt-get install -y postgresql`; .ci/run does)"
        )
    })
}

/// True when this process runs as root (PostgreSQL refuses to).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// uid and gid of the `postgres` system user (Debian's package creates it).
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == "postgres").then(|| (f[2].parse().ok(), f[3].parse().ok()))
        })
        .and_then(|(u, g)| Some((u?, g?)))
        .unwrap_or_else(|| {
            panic!(
                "running as root, PostgreSQL needs the `postgres` system user: install Debian's \
                 postgresql (`apt-get install -y postgresql`)"
            )
        })
}

/// A throwaway PostgreSQL cluster on a free loopback port: its data directory survives
/// [`Postgres::kill`] and [`Postgres::restart`]; everything is killed and removed on drop.
struct Postgres {
    bin: PathBuf,
    port: u16,
    /// Holds `data/` (the cluster), `sock/` (its Unix socket) and `postgres.log`.
    dir: TempDir,
    /// The `postgres` server process itself (exec'd directly, so this PID is the postmaster).
    child: Option<Child>,
    /// uid and gid to run the server as (`None`: as ourselves).
    user: Option<(u32, u32)>,
}

impl Postgres {
    /// `initdb`, start, wait until it accepts connections, `createdb ledger`.
    fn start() -> Postgres {
        let bin = pg_bin_dir();
        let user = running_as_root().then(postgres_user);
        let dir = TempDir::new("pg");
        let sock = dir.path.join("sock");
        std::fs::create_dir_all(&sock).expect("create the socket dir");
        if let Some((uid, gid)) = user {
            for p in [&dir.path, &dir.path.join("policies"), &sock] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", p.display()));
            }
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut pg = Postgres {
            bin,
            port,
            dir,
            child: None,
            user,
        };
        let out = pg
            .command("initdb")
            .args(["-A", "trust", "-U", PG_USER, "-E", "UTF8"])
            .args(["--locale=C", "--no-sync"])
            .arg("-D")
            .arg(pg.data())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        pg.launch();
        let out = pg
            .command("createdb")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", PG_USER, PG_DB])
            .output()
            .expect("run createdb");
        assert!(
            out.status.success(),
            "createdb failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            pg.log()
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path.join("data")
    }

    /// A command for the cluster's binary `name`, run as the server's user, in the temp dir.
    fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.current_dir(&self.dir.path)
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// The server's log so far (for failure messages).
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path.join("postgres.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("\n--- postgres.log (tail) ---\n{}", tail.join("\n"))
    }

    /// Starts `postgres` on the data dir and port and waits until it accepts connections.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path.join("postgres.log"))
            .expect("open postgres.log");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(self.dir.path.join("sock"))
            .args(["-c", "fsync=off"])
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("postgres exited at start ({status}){}", self.log());
            }
            let ready = self
                .command("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", PG_USER, "-d", "postgres"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run pg_isready");
            if ready.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres never accepted connections on port {}{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `postgres://infergate@127.0.0.1:PORT/ledger`.
    fn url(&self) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{PG_DB}", self.port)
    }

    /// SIGKILLs the server and its backends, as a crash would; waits until they are gone.
    fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let backends = common::process::child_pids(child.id());
        let _ = child.kill();
        let _ = child.wait();
        for pid in &backends {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while backends.iter().any(|&p| common::process::is_running(p)) {
            assert!(
                Instant::now() < deadline,
                "postgres backends outlived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The same cluster again, on the same port (it recovers from its WAL).
    fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Before the temp dir (a field) is removed.
        if let Some(mut child) = self.child.take() {
            let backends = common::process::child_pids(child.id());
            let _ = child.kill();
            let _ = child.wait();
            for pid in backends {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// A config directory for replicas of one gateway writing the ledger into `pg`.
fn write_config(dir: &TempDir, engine: &Engine, pg: &Postgres) -> String {
    let extra = format!(
        "ledger: {{postgres: {{url: \"{}\"}}, retention_days: 90}}\n",
        pg.url()
    );
    let setup = Setup {
        workers: &[&engine.url],
        extra: &extra,
        tenants: &TENANTS,
        tiers: TIERS,
        ..Setup::default()
    };
    let config = setup.write(dir);
    std::fs::write(dir.path.join("policies/prices.yaml"), PRICES).expect("write prices.yaml");
    config.to_string_lossy().into_owned()
}

async fn launch(config: &str) -> Gw {
    Gw::launch(&["gateway", "--config", config]).await
}

/// Rows in the ledger, as `/admin/usage` counts them.
async fn ledger_total(gw: &Gw) -> u64 {
    gw.admin_json("/admin/usage?group_by=tenant").await["totals"]["requests"]
        .as_u64()
        .unwrap_or(0)
}

/// `infergate_ledger_rows_total` of `gw`: (written, dropped, failed).
async fn ledger_counts(gw: &Gw) -> (u64, u64, u64) {
    let text = gw.metrics().await;
    let of = |result: &str| {
        common::find_metric(
            &text,
            &format!("infergate_ledger_rows_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0) as u64
    };
    (of("written"), of("dropped"), of("failed"))
}

/// Sends `n` one-token completions, 16 at a time, request `i` to `gws[i % len]` as tenant
/// `TENANTS[(i / len) % 2]`; every one must be answered 200. Returns (request id, tenant).
async fn send(gws: &[&Gw], n: usize, tag: &str) -> Vec<(String, String)> {
    let urls: Arc<Vec<String>> = Arc::new(gws.iter().map(|g| g.at("/v1/completions")).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..16 {
        let (urls, next, tag) = (urls.clone(), next.clone(), tag.to_string());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return out;
                }
                let tenant = TENANTS[(i / urls.len()) % TENANTS.len()].0;
                let body = completion(&format!("{tag} row {i}"), 1);
                let reply = post(&urls[i % urls.len()], Some(&key_of(tenant)), &body).await;
                assert_eq!(reply.status, StatusCode::OK, "{tag} #{i}: {}", reply.text);
                let id = reply.header("x-request-id").expect("x-request-id");
                out.push((id.to_string(), tenant.to_string()));
            }
        });
    }
    set.join_all().await.into_iter().flatten().collect()
}

/// The ledger's raw rows (CSV export) as maps of column to value.
async fn csv_rows(gw: &Gw) -> Vec<HashMap<String, String>> {
    let (status, text) = common::get(&format!("{}/admin/usage.csv", gw.admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header line").split(',').collect();
    assert!(header.contains(&"request_id"), "header: {header:?}");
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_write_one_postgres_ledger() {
    const N: usize = 300;
    let t0 = Instant::now();
    let engine = Engine::start(&[]).await;
    let pg = Postgres::start();
    let dir = TempDir::new("pg-fleet");
    let config = write_config(&dir, &engine, &pg);
    // Started together, as a fleet rolls out: both run the migrations on one empty database.
    let (a, b) = tokio::join!(launch(&config), launch(&config));
    let started = t0.elapsed();

    let sent = send(&[&a, &b], N, "fleet").await;
    assert_eq!(sent.len(), N);
    let ids: HashSet<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids.len(), N, "request ids are distinct across replicas");

    // Each replica wrote its own half, and both read all of it back from the one database.
    for gw in [&a, &b] {
        let page = wait_rows(gw, N as u64, Duration::from_secs(30)).await;
        let groups = page["groups"].as_array().expect("groups");
        let mut per_tenant: Vec<(&str, u64)> = groups
            .iter()
            .map(|g| {
                (
                    g["group"]["tenant"].as_str().expect("tenant"),
                    g["requests"].as_u64().expect("requests"),
                )
            })
            .collect();
        per_tenant.sort();
        assert_eq!(per_tenant, [("acme", 150), ("globex", 150)], "{page}");
        assert!(
            groups.iter().all(|g| g["cost_nanousd"].as_u64() > Some(0)),
            "{page}"
        );
    }
    let dims = "group_by=day,tenant,model,key";
    let mut seen = Vec::new();
    for gw in [&a, &b] {
        let from_rows = gw.admin_json(&format!("/admin/usage?{dims}")).await;
        let from_rollup = gw.admin_json(&format!("/admin/usage/daily?{dims}")).await;
        assert_eq!(
            from_rows["groups"], from_rollup["groups"],
            "the rollup both replicas upserted equals the rows"
        );
        assert_eq!(from_rows["totals"]["requests"], N as u64, "{from_rows}");
        assert_eq!(from_rollup["totals"]["requests"], N as u64, "{from_rollup}");
        seen.push(from_rows["groups"].clone());
    }
    assert_eq!(seen[0], seen[1], "both replicas read the same ledger");

    // Every row counted as written once, by the replica that wrote it; none lost.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (counts_a, counts_b) = loop {
        let (ca, cb) = (ledger_counts(&a).await, ledger_counts(&b).await);
        if ca.0 + cb.0 >= N as u64 || Instant::now() >= deadline {
            break (ca, cb);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        counts_a.0 + counts_b.0,
        N as u64,
        "written: a {counts_a:?}, b {counts_b:?} (written, dropped, failed)"
    );
    assert_eq!(
        counts_a.1 + counts_a.2 + counts_b.1 + counts_b.2,
        0,
        "dropped/failed: a {counts_a:?}, b {counts_b:?}"
    );
    assert!(
        counts_a.0 > 0 && counts_b.0 > 0,
        "each replica writes its own batches: a {counts_a:?}, b {counts_b:?}"
    );
    for gw in [&a, &b] {
        assert_eq!(gw.metric("infergate_ledger_queue_rows").await, 0.0);
    }

    // The raw rows: one per request, each with its own request id and its tenant.
    let sent_tenant: HashMap<&str, &str> = sent
        .iter()
        .map(|(id, t)| (id.as_str(), t.as_str()))
        .collect();
    for gw in [&a, &b] {
        let rows = csv_rows(gw).await;
        assert_eq!(rows.len(), N, "CSV data lines");
        let csv_ids: HashSet<&str> = rows.iter().map(|r| r["request_id"].as_str()).collect();
        assert_eq!(csv_ids.len(), N, "distinct request ids in the CSV");
        assert_eq!(csv_ids, ids, "the CSV holds exactly the requests sent");
        for r in &rows {
            assert_eq!(sent_tenant[r["request_id"].as_str()], r["tenant"], "{r:?}");
            assert_eq!(r["status"], "200", "{r:?}");
        }
    }
    // `infergate usage` reads the same PostgreSQL ledger the config names.
    let table = usage_by_tenant(&config).await;
    let total = table
        .lines()
        .find(|l| l.starts_with("total"))
        .unwrap_or_else(|| panic!("no total line:\n{table}"));
    assert_eq!(
        total.split_whitespace().nth(1),
        Some(N.to_string().as_str()),
        "{table}"
    );
    eprintln!(
        "two replicas: started in {started:?}, {N} rows in {:?}; written a {} + b {}",
        t0.elapsed(),
        counts_a.0,
        counts_b.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_loses_at_most_the_last_flush_and_counts_it() {
    let t0 = Instant::now();
    let engine = Engine::start(&[]).await;
    let mut pg = Postgres::start();
    let dir = TempDir::new("pg-restart");
    let config = write_config(&dir, &engine, &pg);
    let gw = launch(&config).await;

    send(&[&gw], 100, "before").await;
    wait_rows(&gw, 100, Duration::from_secs(30)).await;
    gw.expect_metric(
        "infergate_ledger_rows_total{result=\"written\"}",
        100.0,
        Duration::from_secs(10),
    )
    .await;

    // PostgreSQL crashes: requests are still answered at once (the ledger never blocks them).
    pg.kill();
    let down = Instant::now();
    send(&[&gw], 50, "down").await;
    let down_took = down.elapsed();
    assert!(
        down_took < Duration::from_secs(10),
        "50 requests with PostgreSQL down took {down_took:?}"
    );
    // Give the writer the chance to try a flush while it is down (this waits for the queue to
    // be taken, not for any outcome: a writer that keeps and retries its rows passes too).
    gw.settle_metric("infergate_ledger_queue_rows", Duration::from_secs(5), |v| {
        v == 0.0
    })
    .await;
    let during = ledger_counts(&gw).await;

    // Back on the same data directory: the first 100 rows are still there, and new rows land.
    pg.restart();
    send(&[&gw], 50, "after").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (written, dropped, failed) = loop {
        let c = ledger_counts(&gw).await;
        if c.0 + c.1 + c.2 >= 200 {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "the ledger accounted for {c:?} (written, dropped, failed) of 200 rows\n{}",
            gw.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        written + dropped + failed,
        200,
        "every row counted once: written {written}, dropped {dropped}, failed {failed}"
    );
    let rows = ledger_total(&gw).await;
    eprintln!(
        "restart: written {written}, dropped {dropped}, failed {failed}, rows {rows} \
         (while down: {during:?}; 50 requests took {down_took:?}; test {:?})",
        t0.elapsed()
    );
    assert_eq!(
        rows, written,
        "rows in PostgreSQL equal the rows counted written (failed {failed}, dropped {dropped})"
    );
    assert!(
        failed + dropped <= 50,
        "at most the rows sent while PostgreSQL was down are lost: failed {failed}, dropped {dropped}"
    );
    assert!(rows >= 150, "rows {rows}");
    assert_eq!(gw.metric("infergate_ledger_queue_rows").await, 0.0);

    // A restart while the writer is idle: its kept connection is dead, and the next batch
    // (sent after PostgreSQL is back) reconnects and lands; nothing more is lost.
    pg.kill();
    pg.restart();
    send(&[&gw], 20, "idle-restart").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = ledger_counts(&gw).await;
        if c.0 + c.1 + c.2 >= 220 {
            assert_eq!((c.0, c.1, c.2), (written + 20, dropped, failed), "{c:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ledger accounted for {c:?} of 220 rows"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ledger_total(&gw).await, written + 20);
}

#[test]
fn the_postgres_helper_finds_the_server_binaries() {
    // Fails loudly (rather than the end-to-end tests skipping) when PostgreSQL is missing.
    let bin = pg_bin_dir();
    for tool in ["initdb", "postgres", "pg_isready", "createdb"] {
        assert!(
            Path::new(&bin).join(tool).is_file(),
            "{} has no {tool}",
            bin.display()
        );
    }
}
