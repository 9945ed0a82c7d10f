//! The official OpenAI SDKs (Python `openai`, Node `openai`), unchanged, against `infergate up`:
//! models.retrieve, embeddings, the Responses API streamed and not, `n`, `echo` with logprobs,
//! `top_logprobs`, `seed`, and guidellm's `/health` check. The calls and their checks live in
//! `tests/sdk/` (one script per SDK); this test starts the gateway and runs them.
//!
//! `.ci/run` installs both SDKs (pip `openai`, `npm ci` in tests/sdk). Without one, its part is
//! skipped with a `SKIPPED:` notice, except under `CI`, where it fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::gateway::Gateway;
use common::skip::skipped;

fn sdk_dir() -> PathBuf {
    Path::new(crate::common::REPO).join("tests/sdk")
}

/// Whether `program args` runs and exits 0 (the SDK is installed).
fn runs(program: &str, args: &[&str], dir: &Path) -> bool {
    std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs one SDK script against the gateway; panics with its output when a check fails.
async fn run_script(gw: &Gateway, program: &str, script: &str) {
    let key = gw.api_key.clone().expect("up prints a demo key");
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new(program)
            .arg(script)
            .current_dir(sdk_dir())
            .env("OPENAI_BASE_URL", format!("{}/v1", gw.url))
            .env("OPENAI_API_KEY", key)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {script} did not finish within 240 s"))
    .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{program} {script}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}\ngateway stderr:\n{}",
        out.status,
        gw.stderr()
    );
    println!("{program} {script}:\n{stdout}");
}

/// `name` is usable, or the test must say why not (and fail under CI).
fn available(ok: bool, name: &str, install: &str) -> bool {
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed: {install} (.ci/run does)"
        );
        skipped(&format!(
            "{name} is not installed ({install}); under CI=true this fails"
        ));
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdks_work_unchanged_through_up() {
    let dir = sdk_dir();
    let python = available(
        runs("python3", &["-c", "import openai"], &dir),
        "the OpenAI Python SDK",
        "pip install openai==3.57.0",
    );
    let node = available(
        runs(
            "node",
            &["-e", "import('openai').then(() => process.exit(0))"],
            &dir,
        ),
        "the OpenAI Node SDK",
        "npm ci --prefix tests/sdk",
    );
    if !python && !node {
        return;
    }
    let cache = std::env::temp_dir().join(format!("infergate-sdk-{}", std::process::id()));
    let cache_env = cache.to_string_lossy().into_owned();
    let gw = Gateway::up_with(None, &[("INFERGATE_CACHE_DIR", cache_env.as_str())]).await;
    if python {
        run_script(&gw, "python3", "openai_python.py").await;
    }
    if node {
        run_script(&gw, "node", "openai_node.mjs").await;
    }
    drop(gw);
    let _ = std::fs::remove_dir_all(cache);
}
