//! The quality worker: relayed answers are handed over at their end (a bounded queue, never
//! waited on: a full queue drops the job and counts it), and one thread, off every request's
//! path, scores the sampled ones ([`super::signals`]), counts them per tenant, model and version,
//! feeds the canary's window, and keeps the drift windows ([`super::windows`]) whose PSI it
//! exports. Never the text itself in a metric or a log line.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use prometheus::IntCounter;

use super::capture::Capture;
use super::signals::{self, Asked, SIGNAL_NAMES, Signals};
use super::windows::{DriftBook, FEATURES, Observation, Reference, Scores, WindowSettings};
use crate::ledger::RowText;
use crate::metrics::GatewayMetrics;
use crate::usage_check::TokenUsage;

/// Default share of answers sampled for quality signals.
pub const DEFAULT_SAMPLE_SHARE: f64 = 0.05;
/// Default length of the queue to the quality worker, in answers.
pub const DEFAULT_QUEUE: usize = 4096;
/// Default answers per drift window.
pub const DEFAULT_DRIFT_WINDOW: u64 = 1000;
/// Default PSI above which drift is reported.
pub const DEFAULT_PSI_THRESHOLD: f64 = 0.2;

/// `quality:` as the snapshot holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct QualityConfig {
    /// Share of answers scored, 0..=1 (decided by the request id's hash).
    pub sample_share: f64,
    /// Shares of named pools, in place of `sample_share` (e.g. all of a canary's pool).
    pub pool_share: std::collections::BTreeMap<String, f64>,
    /// Refusal phrases, lowercase.
    pub refusal_phrases: Vec<String>,
    /// Jobs the queue to the worker holds (read at start only).
    pub queue: usize,
    /// Drift windows; `None` keeps none.
    pub drift: Option<DriftConfig>,
    /// Replayed regression prompts (`quality.regression`); `None` (the default) replays none.
    pub regression: Option<super::regression::RegressionConfig>,
}

/// `quality.drift:`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftConfig {
    /// How windows are cut and compared.
    pub windows: WindowSettings,
    /// PSI above which a drift is logged (and alerted on, through the exported threshold).
    pub psi_threshold: f64,
}

impl Default for QualityConfig {
    fn default() -> Self {
        Self {
            sample_share: DEFAULT_SAMPLE_SHARE,
            pool_share: Default::default(),
            refusal_phrases: signals::default_refusals(),
            queue: DEFAULT_QUEUE,
            drift: Some(DriftConfig::default()),
            regression: None,
        }
    }
}

impl Default for DriftConfig {
    fn default() -> Self {
        Self {
            windows: WindowSettings {
                window: DEFAULT_DRIFT_WINDOW,
                reference: Reference::Rolling,
                min_count: DEFAULT_DRIFT_WINDOW / 2,
            },
            psi_threshold: DEFAULT_PSI_THRESHOLD,
        }
    }
}

impl QualityConfig {
    /// The share of `pool`'s answers scored.
    pub fn share_of(&self, pool: &str) -> f64 {
        self.pool_share
            .get(pool)
            .copied()
            .unwrap_or(self.sample_share)
    }

    /// Whether the request `request_id`, served by `pool`, is in the quality sample.
    pub fn sampled(&self, pool: &str, request_id: &str) -> bool {
        crate::trace::sampled(request_id, self.share_of(pool))
    }
}

/// Where a scored answer's raised signals go besides the counters: the serving canary
/// version's analysis window (implemented in `crate::canary`, which depends on this module and
/// not the other way round).
pub trait SignalWindow: Send {
    /// Records the signals `raised` by one scored answer at `at`.
    fn record(&self, raised: &Signals, at: Instant);
}

/// One answer handed to the worker.
pub struct QualityJob {
    /// The caller's tenant (from config: bounded). Row texts, like the ledger's: no allocation
    /// on the request's thread for a job freed on the sampler's.
    pub tenant: RowText,
    /// The model as the client named it.
    pub model: RowText,
    /// The version that served it (`default` without a canary).
    pub version: RowText,
    /// The answer's text, when the request was sampled.
    pub capture: Option<Box<Capture>>,
    /// What the request asked of the answer's shape.
    pub asked: Asked,
    /// The worker's usage.
    pub usage: Option<TokenUsage>,
    /// The canary version's analysis window to feed, when a canary served it.
    pub canary: Option<Box<dyn SignalWindow>>,
    /// The config in force when the request started.
    pub config: Arc<QualityConfig>,
}

/// The handle the account phase hands answers to.
pub struct QualitySampler {
    tx: SyncSender<QualityJob>,
    dropped: IntCounter,
}

impl QualitySampler {
    /// Starts the worker thread with a queue of `queue` jobs.
    pub fn start(metrics: Arc<GatewayMetrics>, queue: usize) -> Result<Arc<Self>, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
        let dropped = metrics.quality_dropped.clone();
        std::thread::Builder::new()
            .name("infergate-quality".into())
            .spawn(move || run(&rx, &metrics))
            .map_err(|e| format!("cannot start the quality worker: {e}"))?;
        Ok(Arc::new(Self { tx, dropped }))
    }

    /// Hands `job` over without waiting; dropped (and counted) when the queue is full.
    pub fn submit(&self, job: QualityJob) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(job) {
            self.dropped.inc();
        }
    }
}

/// The drift windows the worker keeps: per model and version, and per tenant.
#[derive(Default)]
struct Books {
    versions: DriftBook,
    tenants: DriftBook,
}

/// How long the worker rests when the queue is empty. Blocking on the queue instead made every
/// answer's sender wake this thread: a futex call on the request's path and a context switch
/// per answer (10% of the gateway's CPU at 30k answers/s, by `perf`). Resting, it takes what
/// piled up in one go, at most this late; the queue (default 4,096) holds 20 ms of 200k answers/s.
const REST: Duration = Duration::from_millis(20);

/// The worker: until every sender is gone.
fn run(rx: &Receiver<QualityJob>, metrics: &GatewayMetrics) {
    let mut books = Books::default();
    loop {
        match rx.try_recv() {
            Ok(job) => handle(job, metrics, &mut books),
            Err(TryRecvError::Empty) => std::thread::sleep(REST),
            Err(TryRecvError::Disconnected) => return,
        }
    }
}

fn handle(job: QualityJob, m: &GatewayMetrics, books: &mut Books) {
    let labels = [
        job.tenant.as_str(),
        job.model.as_str(),
        job.version.as_str(),
    ];
    if let Some(capture) = &job.capture {
        let raised = signals::score(
            &capture.answer(),
            capture.checkable(job.asked),
            &job.config.refusal_phrases,
        );
        m.quality_sampled.with_label_values(&labels).inc();
        for name in raised.names() {
            debug_assert!(SIGNAL_NAMES.contains(&name));
            m.quality_signals
                .with_label_values(&[labels[0], labels[1], labels[2], name])
                .inc();
        }
        if let Some(window) = &job.canary {
            window.record(&raised, Instant::now());
        }
    }
    let Some(d) = &job.config.drift else { return };
    let observation = Observation {
        prompt_tokens: job.usage.map(|u| u.prompt),
        output_tokens: job.usage.map(|u| u.completion),
        cached_share: job
            .usage
            .filter(|u| u.prompt > 0)
            .map(|u| u.cached.unwrap_or(0) as f64 / u.prompt as f64),
        finish_reason: job.capture.as_ref().and_then(|c| c.finish_reason()),
    };
    let key = (job.model.as_str(), job.version.as_str());
    if let Some(scores) = books.versions.observe(key, &observation, &d.windows) {
        export(m, d, &[key.0, key.1], scores);
    }
    // Tenants are keyed alone (their traffic over every model): the tenant whose inputs moved.
    let tenant = (job.tenant.as_str(), "");
    if let Some(scores) = books.tenants.observe(tenant, &observation, &d.windows) {
        export(m, d, &[tenant.0], scores);
    }
}

/// Sets the PSI gauges of `key` (model and version, or tenant) and logs each above the threshold.
fn export(m: &GatewayMetrics, d: &DriftConfig, key: &[&str], scores: Scores) {
    m.drift_threshold.set(d.psi_threshold);
    let gauge = match key.len() {
        2 => &m.drift_psi,
        _ => &m.drift_tenant_psi,
    };
    for (feature, score) in FEATURES.iter().zip(scores) {
        let Some(psi) = score else { continue };
        let mut labels = key.to_vec();
        labels.push(feature);
        gauge.with_label_values(&labels).set(psi);
        if psi > d.psi_threshold {
            tracing::warn!(
                key = key.join("/"),
                feature,
                psi,
                threshold = d.psi_threshold,
                "input or output distribution drifted"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(config: &Arc<QualityConfig>, text: &str, prompt: u64) -> QualityJob {
        let mut capture = Capture::default();
        let body = serde_json::json!({
            "choices": [{"index": 0, "message": {"content": text}, "finish_reason": "stop"}]
        });
        capture.json_body(body.to_string().as_bytes());
        QualityJob {
            tenant: "acme".into(),
            model: "m".into(),
            version: "default".into(),
            capture: Some(Box::new(capture)),
            asked: Asked::default(),
            usage: Some(TokenUsage {
                prompt,
                completion: 10,
                cached: Some(0),
            }),
            canary: None,
            config: config.clone(),
        }
    }

    #[test]
    fn a_sampled_answer_is_counted_by_its_signals_and_drift_is_exported() {
        let m = GatewayMetrics::new().unwrap();
        let config = QualityConfig {
            drift: Some(DriftConfig {
                windows: WindowSettings {
                    window: 10,
                    reference: Reference::Rolling,
                    min_count: 5,
                },
                psi_threshold: 0.2,
            }),
            ..QualityConfig::default()
        };
        let config = Arc::new(config);
        let mut book = Books::default();
        handle(
            job(&config, "I'm sorry, but I can't do that.", 100),
            &m,
            &mut book,
        );
        handle(job(&config, "", 100), &m, &mut book);
        let sampled = m
            .quality_sampled
            .with_label_values(&["acme", "m", "default"]);
        assert_eq!(sampled.get(), 2);
        let signal = |s| {
            m.quality_signals
                .with_label_values(&["acme", "m", "default", s])
                .get()
        };
        assert_eq!(
            (signal("refusal"), signal("empty"), signal("repetition")),
            (1, 1, 0)
        );
        for _ in 2..10 {
            handle(job(&config, "fine", 100), &m, &mut book);
        }
        for _ in 0..10 {
            handle(job(&config, "fine", 3000), &m, &mut book);
        }
        let psi = m
            .drift_psi
            .with_label_values(&["m", "default", "prompt_tokens"])
            .get();
        assert!(psi > 0.2, "{psi}");
        let tenant = m
            .drift_tenant_psi
            .with_label_values(&["acme", "prompt_tokens"])
            .get();
        assert!(
            (tenant - psi).abs() < 1e-12,
            "the tenant's only traffic: {tenant}"
        );
        assert_eq!(m.drift_threshold.get(), 0.2);
        let text = m.render();
        assert!(!text.contains("sorry"), "the text never reaches a metric");
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let m = Arc::new(GatewayMetrics::new().unwrap());
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let sampler = QualitySampler {
            tx,
            dropped: m.quality_dropped.clone(),
        };
        let config = Arc::new(QualityConfig::default());
        sampler.submit(job(&config, "a", 1));
        sampler.submit(job(&config, "b", 1));
        assert_eq!(m.quality_dropped.get(), 1);
    }
}
