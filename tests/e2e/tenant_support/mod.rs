//! Harness of the tenant tests, on the shared kit (`tests/e2e/common`): a config with tenants and
//! tiers ([`Setup`]) in a private temp directory, the kit's gateway launched on it ([`Gw`]), the
//! API key of each tenant, and the ledger's view through the admin API.
#![allow(dead_code, unused_imports)]

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::common::gateway::Gateway;
use crate::common::settle;

// The kit's keyed requests under the names the tenant tests use.
pub use crate::common::http::{post_as as post, post_raw_as as post_raw};
pub use crate::common::{BoxError, Conn, HTTP_DEADLINE, Reply, TempDir};

/// The model every config here routes (the engine's default model).
pub const MODEL: &str = "llama-3-8b";
/// The pool every config here declares.
pub const POOL: &str = "main";

/// The plain API key the tests give `tenant` (its hash goes into the config).
pub fn key_of(tenant: &str) -> String {
    format!("ig-test-{tenant}-k3y")
}

/// What a test gateway is configured with; `..Setup::default()` leaves out what a test does not
/// set (no admission, context limit, aliases, extra sections, tenants or tiers).
#[derive(Default)]
pub struct Setup<'a> {
    /// Worker URLs of the one pool.
    pub workers: &'a [&'a str],
    /// The pool's `admission:` as a YAML flow mapping, e.g. `{max_queue: 10}`.
    pub admission: Option<&'a str>,
    /// `max_context` of [`MODEL`].
    pub max_context: Option<usize>,
    /// More models routed to the same pool (served upstream as [`MODEL`]).
    pub aliases: &'a [&'a str],
    /// More top-level sections, verbatim (e.g. `limits: {max_body_bytes: 4096}`).
    pub extra: &'a str,
    /// `(name, tier)` of every tenant; each gets the key [`key_of`] its name, stored hashed.
    pub tenants: &'a [(&'a str, &'a str)],
    /// The whole `policies/tenants.yaml`.
    pub tiers: &'a str,
    /// The pool's routing policy (default `least_load`).
    pub policy: Option<&'a str>,
}

impl Setup<'_> {
    /// The `infergate.yaml` text.
    pub fn config_yaml(&self) -> String {
        let mut s = String::from(
            "listen: \"127.0.0.1:0\"\nadmin: {listen: \"127.0.0.1:0\"}\npolicies: policies\n\
             health: {poll_interval: 100ms, timeout: 1s, eject_after: 3, readmit_after: 1}\n",
        );
        s.push_str(self.extra);
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s.push_str(&format!("models:\n  - name: {MODEL}\n    pool: {POOL}\n"));
        if let Some(n) = self.max_context {
            s.push_str(&format!("    max_context: {n}\n"));
        }
        for alias in self.aliases {
            s.push_str(&format!(
                "  - name: {alias}\n    pool: {POOL}\n    upstream_model: {MODEL}\n"
            ));
        }
        s.push_str(&format!("pools:\n  - name: {POOL}\n    workers:\n"));
        for w in self.workers {
            s.push_str(&format!("      - url: {w}\n"));
        }
        if let Some(a) = self.admission {
            s.push_str(&format!("    admission: {a}\n"));
        }
        s.push_str("tenants:\n");
        for (name, tier) in self.tenants {
            let hash =
                infergate::tenants::format_hash(&infergate::tenants::hash_key(&key_of(name)));
            s.push_str(&format!(
                "  - {{name: {name}, tier: {tier}, keys: [\"{hash}\"]}}\n"
            ));
        }
        s
    }

    /// Writes the config and tiers into `dir`; returns the config path.
    pub fn write(&self, dir: &TempDir) -> PathBuf {
        dir.write("policies/tenants.yaml", self.tiers);
        dir.write(
            "policies/routing.yaml",
            &format!(
                "pools:\n  {POOL}:\n    policy: {}\n",
                self.policy.unwrap_or("least_load")
            ),
        );
        dir.write("infergate.yaml", &self.config_yaml())
    }
}

/// The kit's [`Gateway`] (killed on drop, with the workers `up` spawned) on a tenant config,
/// logging warnings only; it keeps the config directory it was started from.
pub struct Gw {
    gw: Gateway,
    // Dropped after the gateway, which reads it until it stops.
    _dir: Option<TempDir>,
}

impl Deref for Gw {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gw
    }
}

impl DerefMut for Gw {
    fn deref_mut(&mut self) -> &mut Gateway {
        &mut self.gw
    }
}

impl Gw {
    /// Writes `setup` into a fresh directory and runs `infergate gateway` on it until ready.
    pub async fn start(setup: &Setup<'_>) -> Gw {
        let dir = TempDir::new("tenants-gw");
        let config = setup.write(&dir).to_string_lossy().into_owned();
        let mut gw = Self::launch(&["gateway", "--config", &config]).await;
        gw._dir = Some(dir);
        gw
    }

    /// `infergate ARGS --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`, until `/readyz` is 200.
    pub async fn launch(args: &[&str]) -> Gw {
        let mut args = args.to_vec();
        args.extend(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        let gw = Gateway::launch(&args, &[("RUST_LOG", "warn")]).await;
        Gw { gw, _dir: None }
    }
}

/// Polls `/admin/usage` until the ledger holds `n` rows (never more), failing after `within`.
pub async fn wait_rows(gw: &Gateway, n: u64, within: Duration) -> Value {
    let every = Duration::from_millis(100);
    let read = || gw.admin_json("/admin/usage?group_by=tenant");
    let rows = |page: &Value| page["totals"]["requests"].as_u64().unwrap_or(0);
    let page = settle(within, every, read, |page| rows(page) >= n).await;
    let have = rows(&page);
    assert!(
        have >= n,
        "ledger holds {have} of {n} rows: {page}\n{}",
        gw.output()
    );
    assert_eq!(have, n, "more rows than requests: {page}");
    page
}

/// `infergate usage --config CONFIG --by tenant`, expected to succeed: the table it printed.
pub async fn usage_by_tenant(config: &str) -> String {
    let mut cmd = crate::common::process::infergate();
    cmd.args(["usage", "--config", config, "--by", "tenant"]);
    let out = crate::common::process::run(cmd, Duration::from_secs(30)).await;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "infergate usage: {table}{stderr}");
    table
}

/// A `/v1/completions` body for [`MODEL`]: exactly `max_tokens` completion tokens.
pub fn completion(prompt: &str, max_tokens: u64) -> Value {
    serde_json::json!({
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true,
    })
}

/// Exact prompt tokens of `text` as the gateway estimates them for [`MODEL`] (cl100k).
pub fn prompt_tokens(text: &str) -> u64 {
    infergate::tokens::Estimator::Cl100k.count(text)
}
