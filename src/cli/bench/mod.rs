//! `infergate bench`: replay a workload against a gateway or an engine over HTTP, streaming every
//! answer, and report TTFT, every inter-token gap, e2e, status, worker and execution path per
//! request, summarized as [`crate::report::Report`]; `infergate bench diff` compares two reports.
//!
//! One process holds thousands of streams: each in-flight request is a task with a few numbers,
//! its gap list and an unfinished-line buffer. Every stream needs one file descriptor, so raise
//! the limit (`ulimit -n 8192`) before runs above ~1,000 concurrent requests.

mod args;
mod client;
mod driver;
pub mod expect;
mod progress;
mod sse;

#[cfg(test)]
mod mock_server;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use args::{BenchArgs, BenchCli, BenchCommand, Endpoint, parse_duration};
pub use client::{Target, TargetSpec, parse_route_cached};
pub use driver::{Outcome, closed_loop, open_loop};
pub use progress::{Progress, Ticker};
pub use sse::{SseReader, StreamStats, path_class};

use crate::report::{self, Report};
use crate::workload::{self, Arrival, Overrides};

/// Runs `bench` or `bench diff`, returning the text to print.
pub async fn main(cli: BenchCli) -> Result<String, String> {
    match cli.command {
        Some(BenchCommand::Diff { a, b }) => run_diff(&a, &b),
        None => run(cli.args).await,
    }
}

/// Runs the workload against `--url`, writes the JSON report (and the records when asked) and
/// returns the text report.
pub async fn run(args: BenchArgs) -> Result<String, String> {
    let Some(url) = args.url.clone() else {
        return Err("bench needs --url (the gateway or engine, e.g. http://127.0.0.1:8080)".into());
    };
    let workload = workload::load_or_replay(&args.workload, args.replay.as_deref(), args.speed)?;
    let expectations = expect::parse(&args.expect_path)?;
    if !expectations.is_empty() {
        let mut classes: Vec<&str> = workload
            .mix
            .iter()
            .flat_map(|m| &m.classes)
            .map(|c| c.name.as_str())
            .collect();
        // A replay's classes are its lines' (`replay` where a line names none).
        if let Arrival::Trace(trace) = &workload.arrival {
            classes.extend(trace.entries.iter().filter_map(|e| e.class.as_deref()));
            classes.sort_unstable();
            classes.dedup();
        }
        expect::check_classes(&expectations, &classes)?;
    }
    let overrides = Overrides {
        duration: args.duration,
        rate: args.rate,
        seed: args.seed,
    };
    let spec = TargetSpec {
        url,
        endpoint: args.endpoint,
        model: args.model.clone(),
        api_key: args
            .api_key
            .clone()
            .or_else(|| std::env::var("INFERGATE_API_KEY").ok()),
        tenant_keys: args::parse_tenant_keys(&args.tenant_keys)?,
        max_connections: args.max_connections.max(1),
        idle_timeout: args.idle_timeout,
    };
    let target = Arc::new(Target::new(&spec)?);
    let planned = overrides.duration.unwrap_or(workload.duration);
    let progress = Arc::new(Progress::default());
    let ticker = Ticker::start(progress.clone(), planned, args.quiet);
    let watch = progress.clone();
    let outcome = match workload.concurrency() {
        Some(clients) => {
            let plan = workload.open_ended(&overrides)?;
            let clients = clients.min(spec.max_connections);
            closed_loop(target.clone(), plan, clients, planned, progress).await
        }
        None => {
            let plan = workload.requests(&overrides)?;
            open_loop(target.clone(), plan, spec.max_connections, progress).await
        }
    };
    ticker.finish();
    if watch.stopped_on_auth() {
        let hint = if spec.api_key.is_none() && spec.tenant_keys.is_empty() {
            "pass --api-key KEY (or set INFERGATE_API_KEY); `infergate up` printed a demo key at start"
        } else {
            "the key given was refused: check --api-key / INFERGATE_API_KEY against the gateway's tenants"
        };
        return Err(format!(
            "the target answered 401/403 to the first requests, so the run stopped: {hint}"
        ));
    }
    let title = format!(
        "infergate bench · workload {} · {} {} · model {}",
        workload.name,
        args.endpoint.name(),
        target.uri(),
        args.model
    );
    let elapsed = outcome.elapsed.as_secs_f64();
    let slo = workload.slo;
    let report = report::summarize(&title, &outcome.records, elapsed, slo.ttft, slo.itl);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{}.json", workload.name)));
    write(&out, &report.to_json())?;
    let mut text = report.render_text();
    text.push_str(&format!("\nreport: {}\n", out.display()));
    if let Some(path) = &args.records {
        write(path, &report::records_jsonl(&outcome.records))?;
        text.push_str(&format!("records: {}\n", path.display()));
    }
    if !outcome.records.iter().any(|r| r.ok()) {
        // The report is written (it says what failed), but a run with no success is no result.
        print!("{text}");
        return Err(format!(
            "none of the {} requests succeeded (see {})",
            outcome.records.len(),
            out.display()
        ));
    }
    if !expectations.is_empty() {
        let (lines, verdict) = expect::outcome(&expect::judge(&expectations, &outcome.records));
        text.push('\n');
        text.push_str(&lines);
        if let Err(e) = verdict {
            print!("{text}");
            return Err(e);
        }
    }
    Ok(text)
}

/// Compares two JSON reports: `b` against the baseline `a`.
pub fn run_diff(a: &Path, b: &Path) -> Result<String, String> {
    let read = |p: &Path| {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        Report::from_json(&text).map_err(|e| format!("{}: {e}", p.display()))
    };
    Ok(report::diff(&read(a)?, &read(b)?))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
