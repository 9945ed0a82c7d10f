//! Validation of `pools:` (names, dialects, worker sources) and `models:` (each naming a pool).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::raw::{RawAdmission, RawKvEvents, RawModel, RawPool, RawWorker, Text};
use super::snapshot::{
    AdmissionSpec, Dialect, ModelRoute, PoolSpec, VllmKvEventsSpec, WorkerSource,
};
use super::values::{parse_duration, parse_worker_url};
use crate::admission::FairWeights;
use crate::diagnostics::Sink;
use crate::routing::{PolicyConfig, PrefixConfig};

/// Re-resolution interval of a `dns` source when none is given.
const DEFAULT_DNS_INTERVAL: Duration = Duration::from_secs(5);
/// Most slots past a pool's capacity fair share may lend (`borrow_slots`).
const MAX_BORROW_SLOTS: usize = 4096;

/// Builds the pools, with the default policy (`prefix`); routing.yaml overrides it later.
/// Spawn arguments naming files resolve against `base`, the config file's directory.
pub(super) fn pools(raw: &[RawPool], base: &Path, sink: &mut Sink<'_>) -> Vec<PoolSpec> {
    let mut first_line: HashMap<&str, u64> = HashMap::new();
    let mut pools = Vec::with_capacity(raw.len());
    for pool in raw {
        let name = &pool.name;
        if name.value.trim().is_empty() {
            sink.at(&name.referenced, "pool name is empty");
        } else if let Some(line) = first_line.get(name.value.as_str()) {
            let msg = format!(
                "duplicate pool name `{}` (first on line {line})",
                name.value
            );
            sink.at(&name.referenced, msg);
        } else {
            first_line.insert(&name.value, name.referenced.line());
        }
        let raw_workers = pool.workers.as_deref().unwrap_or_default();
        if raw_workers.is_empty() {
            let msg = format!(
                "pool `{}` has no workers: add url, spawn or dns entries",
                name.value
            );
            sink.at(&name.referenced, msg);
        }
        let workers = raw_workers
            .iter()
            .filter_map(|w| worker(&name.value, w, base, sink))
            .collect();
        let admission = admission(&name.value, pool.admission.as_ref(), sink);
        let kv_events = pool
            .kv_events
            .as_ref()
            .and_then(|k| kv_events(&name.value, k, base, sink));
        pools.push(PoolSpec {
            name: name.value.clone(),
            dialect: pool.dialect.unwrap_or(Dialect::Infergate),
            workers,
            policy: PolicyConfig::Prefix(PrefixConfig::default()),
            admission,
            kv_events,
        });
    }
    pools
}

/// Engine flags whose value names a file or directory.
const PATH_FLAGS: [&str; 2] = ["--model", "--chat-template"];

/// Spawn arguments with the values of [`PATH_FLAGS`] resolved against `base`, like every other
/// path in the config, so a worker finds `--model ./m.gguf` from any working directory. A
/// `--model` value is a path when it exists under `base`, starts with `./` or `../`, or ends in
/// `.gguf`; otherwise it is a preset name or Hugging Face id and stays as written.
pub(super) fn spawn_args(args: &[String], base: &Path) -> Vec<String> {
    let resolve = |flag: &str, value: &str| -> String {
        let path = Path::new(value);
        let joined = base.join(path);
        let is_path = flag == "--chat-template"
            || joined.exists()
            || value.starts_with("./")
            || value.starts_with("../")
            || value.ends_with(".gguf");
        if path.is_absolute() || !is_path {
            return value.to_string();
        }
        std::path::absolute(&joined)
            .unwrap_or(joined)
            .to_string_lossy()
            .into_owned()
    };
    let mut out = Vec::with_capacity(args.len());
    let mut pending: Option<&str> = None;
    for arg in args {
        if let Some(flag) = pending.take() {
            out.push(resolve(flag, arg));
            continue;
        }
        let split = arg.split_once('=');
        match split.filter(|(flag, _)| PATH_FLAGS.contains(flag)) {
            Some((flag, value)) => out.push(format!("{flag}={}", resolve(flag, value))),
            None => {
                pending = PATH_FLAGS.iter().copied().find(|f| f == arg);
                out.push(arg.clone());
            }
        }
    }
    out
}

/// A pool's admission bounds, defaults filled in; invalid values are reported.
fn admission(pool: &str, raw: Option<&RawAdmission>, sink: &mut Sink<'_>) -> AdmissionSpec {
    let mut spec = AdmissionSpec::default();
    let Some(raw) = raw else {
        return spec;
    };
    if let Some(n) = &raw.max_in_flight_per_worker {
        if n.value == 0 {
            sink.at(
                &n.referenced,
                format!("pool `{pool}`: max_in_flight_per_worker must be at least 1"),
            );
        } else {
            spec.max_in_flight_per_worker = n.value;
        }
    }
    if let Some(q) = raw.max_queue {
        spec.max_queue = q;
    }
    if let Some(text) = &raw.max_wait {
        match parse_duration(&text.value) {
            Ok(d) => spec.max_wait = d,
            Err(message) => sink.at(
                &text.referenced,
                format!("pool `{pool}`: max_wait: {message}"),
            ),
        }
    }
    if let Some(fair) = &raw.fair_share {
        let default = FairWeights::default();
        let mut weights = FairWeights {
            input: fair.value.input_weight.unwrap_or(default.input),
            output: fair.value.output_weight.unwrap_or(default.output),
            locality_window: fair
                .value
                .locality_window
                .unwrap_or(default.locality_window),
            borrow_slots: default.borrow_slots,
        };
        if let Some(b) = &fair.value.borrow_slots {
            match usize::try_from(b.value) {
                Ok(n) if n <= MAX_BORROW_SLOTS => weights.borrow_slots = n,
                _ => sink.at(
                    &b.referenced,
                    format!(
                        "pool `{pool}`: fair_share: borrow_slots must be 0 to {MAX_BORROW_SLOTS}, got {}",
                        b.value
                    ),
                ),
            }
        }
        let valid = |w: f64| w.is_finite() && (0.0..=1e6).contains(&w);
        if !(weights.locality_window.is_finite() && (0.0..=1e9).contains(&weights.locality_window))
        {
            sink.at(
                &fair.referenced,
                format!(
                    "pool `{pool}`: fair_share: locality_window must be weighted tokens in [0, 1e9]"
                ),
            );
        } else if !valid(weights.input)
            || !valid(weights.output)
            || weights.input + weights.output == 0.0
        {
            sink.at(
                &fair.referenced,
                format!(
                    "pool `{pool}`: fair_share: input_weight and output_weight must be numbers in [0, 1e6], not both 0"
                ),
            );
        } else {
            spec.fair_share = Some(weights);
        }
    }
    spec
}

/// One worker source, or `None` after reporting why it is invalid.
fn worker(pool: &str, raw: &RawWorker, base: &Path, sink: &mut Sink<'_>) -> Option<WorkerSource> {
    let mut fail = |at: &Text, message: String| {
        sink.at(&at.referenced, format!("pool `{pool}`: {message}"));
        None
    };
    match raw {
        RawWorker::Url(url) => match parse_worker_url(&url.value) {
            Ok(url) => Some(WorkerSource::Url(url)),
            Err(message) => fail(url, message),
        },
        RawWorker::Spawn(spawn) => {
            let count = spawn.count.as_ref();
            if let Some(count) = count.filter(|c| c.value == 0) {
                sink.at(
                    &count.referenced,
                    format!("pool `{pool}`: spawn count must be ≥ 1"),
                );
                return None;
            }
            Some(WorkerSource::Spawn {
                count: count.map_or(1, |c| c.value),
                args: spawn_args(spawn.args.as_deref().unwrap_or_default(), base),
            })
        }
        RawWorker::Dns(dns) => {
            if dns.name.value.trim().is_empty() {
                return fail(&dns.name, "dns name is empty".into());
            }
            if dns.port.value == 0 {
                let at = &dns.port.referenced;
                sink.at(at, format!("pool `{pool}`: dns port must be 1..=65535"));
                return None;
            }
            let scheme = match &dns.scheme {
                Some(s) if s.value == "http" || s.value == "https" => s.value.clone(),
                Some(s) => {
                    let got = &s.value;
                    return fail(s, format!("dns scheme must be http or https, not `{got}`"));
                }
                None => "http".to_string(),
            };
            let interval = match &dns.interval {
                None => DEFAULT_DNS_INTERVAL,
                Some(text) => match parse_duration(&text.value) {
                    Ok(d) if d.is_zero() => {
                        return fail(text, "dns interval must be greater than zero".into());
                    }
                    Ok(d) => d,
                    Err(message) => return fail(text, format!("dns interval: {message}")),
                },
            };
            Some(WorkerSource::Dns {
                name: dns.name.value.clone(),
                port: dns.port.value,
                scheme,
                interval,
            })
        }
    }
}

/// Longest topic accepted (vLLM's are short names).
const MAX_TOPIC_BYTES: usize = 256;

/// A pool's vLLM KV-event source: a `tcp://HOST:PORT` endpoint (`{host}` allowed for the host),
/// a short topic and a readable `tokenizer.json`; each fault reported at its line.
fn kv_events(
    pool: &str,
    raw: &RawKvEvents,
    base: &Path,
    sink: &mut Sink<'_>,
) -> Option<VllmKvEventsSpec> {
    let mut ok = true;
    let check = |at: &Text, what: &str, sink: &mut Sink<'_>, ok: &mut bool| -> String {
        let endpoint = at.value.trim().to_string();
        let valid = endpoint
            .strip_prefix("tcp://")
            .and_then(|rest| rest.rsplit_once(':'))
            .is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
        if !valid {
            let msg = format!(
                "pool `{pool}`: kv_events.{what} must be tcp://HOST:PORT (the zmq template's HOST may be {{host}}, each worker's), not `{endpoint}`"
            );
            sink.at(&at.referenced, msg);
            *ok = false;
        }
        endpoint
    };
    let endpoint = raw.zmq.as_ref().map(|z| check(z, "zmq", sink, &mut ok));
    let mut endpoints = Vec::new();
    for (url, at) in raw.endpoints.iter().flatten() {
        let e = check(at, "endpoints", sink, &mut ok);
        match parse_worker_url(&url.value) {
            Ok(u) => endpoints.push((u, e)),
            Err(message) => {
                sink.at(
                    &url.referenced,
                    format!("pool `{pool}`: kv_events.endpoints: {message}"),
                );
                ok = false;
            }
        }
    }
    // Deterministic order whatever the map's.
    endpoints.sort();
    if endpoint.is_none() && endpoints.is_empty() {
        sink.at(
            &raw.tokenizer.referenced,
            format!(
                "pool `{pool}`: kv_events needs `zmq` (a template for every worker) or `endpoints`"
            ),
        );
        ok = false;
    }
    let topic = raw
        .topic
        .as_ref()
        .map_or(String::new(), |t| t.value.clone());
    if let Some(t) = raw
        .topic
        .as_ref()
        .filter(|t| t.value.len() > MAX_TOPIC_BYTES)
    {
        let msg = format!("pool `{pool}`: kv_events.topic is longer than {MAX_TOPIC_BYTES} bytes");
        sink.at(&t.referenced, msg);
        ok = false;
    }
    use crate::workers::vllm_events::vocab::{BUILTIN_CL100K, Vocab};
    let builtin = raw.tokenizer.value.trim() == BUILTIN_CL100K;
    let joined = base.join(&raw.tokenizer.value);
    let path = match builtin {
        true => std::path::PathBuf::from(BUILTIN_CL100K),
        false => std::path::absolute(&joined).unwrap_or(joined),
    };
    let vocab = match builtin {
        true => Vocab::cl100k(),
        false => std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| Vocab::from_tokenizer_json(&text)),
    };
    let vocab = match vocab {
        Ok(v) => v,
        Err(e) => {
            sink.at(
                &raw.tokenizer.referenced,
                format!("pool `{pool}`: kv_events.tokenizer: {e}"),
            );
            return None;
        }
    };
    let chat = match raw.chat_template.as_ref() {
        None => None,
        Some(t) if t.value.trim() == "chatml" => {
            Some(crate::routing::chat_keys::ChatMarkup::chatml(&vocab))
        }
        Some(t) => {
            sink.at(
                &t.referenced,
                format!(
                    "pool `{pool}`: kv_events.chat_template must be `chatml` (the only template the gateway writes), not `{}`",
                    t.value
                ),
            );
            ok = false;
            None
        }
    };
    ok.then(|| VllmKvEventsSpec {
        endpoint,
        endpoints,
        topic,
        tokenizer: path,
        vocab: std::sync::Arc::new(vocab),
        chat,
    })
}

/// Builds the model routes, resolving each pool name to its index in `pools`.
pub(super) fn models(raw: &[RawModel], pools: &[PoolSpec], sink: &mut Sink<'_>) -> Vec<ModelRoute> {
    let mut first_line: HashMap<&str, u64> = HashMap::new();
    let mut models = Vec::with_capacity(raw.len());
    for model in raw {
        let name = &model.name;
        if name.value.trim().is_empty() {
            sink.at(&name.referenced, "model name is empty");
        } else if let Some(line) = first_line.get(name.value.as_str()) {
            let msg = format!(
                "duplicate model name `{}` (first on line {line})",
                name.value
            );
            sink.at(&name.referenced, msg);
        } else {
            first_line.insert(&name.value, name.referenced.line());
        }
        let Some(pool) = pools.iter().position(|p| p.name == model.pool.value) else {
            let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            let msg = format!(
                "model `{}` names unknown pool `{}` (pools: {})",
                name.value,
                model.pool.value,
                known.join(", ")
            );
            sink.at(&model.pool.referenced, msg);
            continue;
        };
        models.push(ModelRoute {
            name: name.value.clone(),
            pool,
            upstream_model: model.upstream_model.clone(),
            max_context: model.max_context,
            tokenizer: model.tokenizer.unwrap_or_default(),
            direct: model.direct.unwrap_or(false),
        });
    }
    models
}
