//! Warm-up before readiness: an engine started with capture sizes runs each size once on its
//! backend (sim charges the modelled capture time, cpu runs a real forward pass, cuda captures
//! its graph) before `/ready` answers 200 and generation is accepted. `/health` stays the
//! liveness answer throughout, so a supervisor can tell "starting" from "dead".
//!
//! The plan is pure (sizes and their modelled cost); [`WarmupState`] is what the server and the
//! core thread share: the ready flag, and what each size took, exported on `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::backend::Backend;
use crate::capture_cost::{CaptureCostModel, SizeCost};
use crate::clock::Clock;

/// Default of `--sim-capture-time-scale`: the sim backend waits 1% of the modelled capture time,
/// so vLLM's default 35 sizes on Llama-3-8B (about 1.8 s modelled) cost an engine start 18 ms:
/// visible in the metrics, invisible to the many tests that start engines.
pub const DEFAULT_SIM_CAPTURE_TIME_SCALE: f64 = 0.01;

/// What warm-up will run: each capture size with its modelled cost.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupPlan {
    /// One entry per size, ascending.
    pub sizes: Vec<SizeCost>,
}

impl WarmupPlan {
    /// The plan of `sizes` priced by `model` (sim and cuda), ascending and distinct.
    pub fn priced(sizes: &[usize], model: &CaptureCostModel) -> Self {
        Self {
            sizes: model.of(sizes).sizes,
        }
    }

    /// The plan of `sizes` with no modelled cost (a backend whose cost is whatever it takes).
    pub fn unpriced(sizes: &[usize]) -> Self {
        let mut v = sizes.to_vec();
        v.sort_unstable();
        v.dedup();
        Self {
            sizes: v
                .into_iter()
                .map(|size| SizeCost {
                    size,
                    bytes: 0,
                    seconds: 0.0,
                })
                .collect(),
        }
    }

    /// Nothing to warm up: the engine is ready at once.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Modelled seconds of the whole plan, scaled by `scale` (the sim backend's wait).
    pub fn scaled_seconds(&self, scale: f64) -> f64 {
        self.sizes.iter().map(|c| c.seconds * scale).sum()
    }
}

/// Checks `--sim-capture-time-scale`: finite and not negative (0 skips the wait).
pub fn check_scale(scale: f64) -> Result<f64, String> {
    if scale.is_finite() && scale >= 0.0 {
        Ok(scale)
    } else {
        Err(format!(
            "--sim-capture-time-scale must be a number >= 0, not {scale}"
        ))
    }
}

/// What warming one size took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeWarmup {
    /// The batch size.
    pub size: usize,
    /// Seconds it took (sim: the charged, scaled seconds).
    pub seconds: f64,
    /// Device memory it keeps (sim: modelled; cuda: measured; cpu: 0, nothing is kept).
    pub bytes: u64,
}

/// What a backend reports for one warmed size.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Warmed {
    /// Device memory the size keeps.
    pub bytes: u64,
    /// Seconds the runner waits on the engine's clock for it (sim: the scaled modelled capture
    /// time); 0 for a backend whose warm-up took real time already.
    pub charge_seconds: f64,
}

/// Runs `plan` on `backend`, recording each size in `state`, then marks it ready; a failure
/// leaves the engine not ready, with the reason.
pub fn run(backend: &mut dyn Backend, clock: &dyn Clock, plan: &WarmupPlan, state: &WarmupState) {
    let start = clock.now();
    for cost in &plan.sizes {
        let t0 = clock.now();
        match backend.warm_up(cost) {
            Ok(w) => {
                if w.charge_seconds > 0.0 {
                    clock.sleep_until(clock.now() + w.charge_seconds);
                }
                state.record(SizeWarmup {
                    size: cost.size,
                    seconds: clock.now() - t0,
                    bytes: w.bytes,
                });
            }
            Err(e) => {
                state.fail(format!("batch size {}: {e}", cost.size));
                return;
            }
        }
    }
    state.finish(clock.now() - start);
}

/// Readiness and warm-up results, shared by the core thread (writer) and the server (reader).
#[derive(Debug, Default)]
pub struct WarmupState {
    ready: AtomicBool,
    done: Mutex<Done>,
}

#[derive(Debug, Default)]
struct Done {
    sizes: Vec<SizeWarmup>,
    seconds: f64,
    error: Option<String>,
}

impl WarmupState {
    /// Not ready until [`finish`](Self::finish).
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether warm-up is over: `/ready` answers 200 and generation is accepted.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Records one warmed size (logged, and exported at once so progress shows).
    pub fn record(&self, w: SizeWarmup) {
        tracing::info!(
            batch_size = w.size,
            seconds = w.seconds,
            bytes = w.bytes,
            "warmed capture size"
        );
        self.lock().sizes.push(w);
    }

    /// Warm-up is over after `seconds`: the engine is ready.
    pub fn finish(&self, seconds: f64) {
        let sizes = {
            let mut d = self.lock();
            d.seconds = seconds;
            d.sizes.len()
        };
        tracing::info!(sizes, seconds, "warm-up done: engine ready");
        self.ready.store(true, Ordering::Release);
    }

    /// Warm-up failed: the engine stays not ready (alive, so the reason can be read).
    pub fn fail(&self, error: String) {
        tracing::error!(%error, "warm-up failed: the engine will not report ready");
        self.lock().error = Some(error);
    }

    /// Why `/ready` answers 503.
    pub fn not_ready_reason(&self) -> String {
        let d = self.lock();
        match &d.error {
            Some(e) => format!("warm-up failed: {e}"),
            None => format!("warming up: {} capture sizes done", d.sizes.len()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Done> {
        self.done.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prometheus text: `infergate_engine_ready`, `infergate_engine_warmup_seconds`, and per
    /// warmed size `infergate_engine_capture_seconds{size}` and `infergate_engine_capture_bytes{size}`
    /// (bounded by the capture list, at most 512 sizes).
    pub fn render(&self) -> String {
        let d = self.lock();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP infergate_engine_ready 1 once warm-up ran every capture size (GET /ready answers 200), else 0.\n\
             # TYPE infergate_engine_ready gauge\n\
             infergate_engine_ready {}",
            u8::from(self.is_ready())
        );
        let _ = writeln!(
            out,
            "# HELP infergate_engine_warmup_seconds Seconds warm-up took before the engine was ready (0 until done).\n\
             # TYPE infergate_engine_warmup_seconds gauge\n\
             infergate_engine_warmup_seconds {}",
            d.seconds
        );
        out.push_str(
            "# HELP infergate_engine_capture_seconds Start-up seconds warming one capture size took.\n\
             # TYPE infergate_engine_capture_seconds gauge\n",
        );
        for w in &d.sizes {
            let _ = writeln!(
                out,
                "infergate_engine_capture_seconds{{size=\"{}\"}} {}",
                w.size, w.seconds
            );
        }
        out.push_str(
            "# HELP infergate_engine_capture_bytes Device memory one capture size keeps (sim: modelled; cpu: 0).\n\
             # TYPE infergate_engine_capture_bytes gauge\n",
        );
        for w in &d.sizes {
            let _ = writeln!(
                out,
                "infergate_engine_capture_bytes{{size=\"{}\"}} {}",
                w.size, w.bytes
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec_path::CaptureSizes;
    use crate::presets;

    fn model() -> CaptureCostModel {
        CaptureCostModel::new(
            presets::gpu("h100").unwrap(),
            presets::model("llama-3-8b").unwrap(),
            1,
        )
    }

    #[test]
    fn the_plan_prices_each_size_once_ascending() {
        let plan = WarmupPlan::priced(&[8, 1, 4, 8], &model());
        let sizes: Vec<usize> = plan.sizes.iter().map(|c| c.size).collect();
        assert_eq!(sizes, [1, 4, 8]);
        assert_eq!(plan.sizes[2], model().size(8));
        let full = plan.scaled_seconds(1.0);
        assert!((full - model().of(&[1, 4, 8]).seconds).abs() < 1e-12);
        assert!((plan.scaled_seconds(0.01) - full * 0.01).abs() < 1e-12);
        assert!(WarmupPlan::priced(CaptureSizes::none().as_slice(), &model()).is_empty());
    }

    #[test]
    fn the_default_scale_keeps_a_default_engine_start_short() {
        let plan = WarmupPlan::priced(CaptureSizes::vllm_default(256).as_slice(), &model());
        assert_eq!(plan.sizes.len(), 35);
        let full = plan.scaled_seconds(1.0);
        assert!(full > 1.0 && full < 3.0, "{full}");
        assert!(plan.scaled_seconds(DEFAULT_SIM_CAPTURE_TIME_SCALE) < 0.05);
    }

    #[test]
    fn an_unpriced_plan_has_its_sizes_and_bad_scales_are_refused() {
        let plan = WarmupPlan::unpriced(&[2, 1, 2]);
        assert_eq!(plan.sizes.len(), 2);
        assert_eq!(plan.scaled_seconds(1.0), 0.0);
        assert!(check_scale(-1.0).is_err());
        assert!(check_scale(f64::NAN).is_err());
        assert_eq!(check_scale(0.0), Ok(0.0));
    }

    /// A backend whose warm-up charges one second a size and fails on size 3.
    struct Charging;

    impl Backend for Charging {
        fn execute(
            &mut self,
            _: &crate::scheduler::Batch,
            _: &[crate::sequence::Sequence],
        ) -> crate::roofline::StepCost {
            unreachable!("warm-up runs no steps")
        }
        fn sample(&mut self, _: &mut crate::sequence::Sequence) -> crate::backend::Sampled {
            unreachable!()
        }
        fn prompt_logprobs(&mut self, _: &mut crate::sequence::Sequence) {}
        fn eos_token(&self) -> u32 {
            0
        }
        fn warm_up(&mut self, cost: &SizeCost) -> Result<Warmed, String> {
            if cost.size == 3 {
                return Err("no memory".into());
            }
            Ok(Warmed {
                bytes: cost.size as u64,
                charge_seconds: 1.0,
            })
        }
    }

    #[test]
    fn the_runner_charges_the_clock_per_size_then_is_ready() {
        let clock = crate::clock::VirtualClock::new();
        let state = WarmupState::new();
        run(
            &mut Charging,
            &clock,
            &WarmupPlan::unpriced(&[2, 1]),
            &state,
        );
        assert!(state.is_ready());
        assert!((clock.now() - 2.0).abs() < 1e-9);
        let text = state.render();
        assert!(
            text.contains("infergate_engine_warmup_seconds 2\n"),
            "{text}"
        );
        assert!(text.contains("infergate_engine_capture_bytes{size=\"2\"} 2\n"));
        let failed = WarmupState::new();
        run(
            &mut Charging,
            &clock,
            &WarmupPlan::unpriced(&[1, 3, 4]),
            &failed,
        );
        assert!(!failed.is_ready());
        assert!(
            failed
                .not_ready_reason()
                .contains("batch size 3: no memory")
        );
    }

    #[test]
    fn readiness_turns_on_at_finish_and_the_metrics_say_so() {
        let s = WarmupState::new();
        assert!(!s.is_ready());
        assert!(s.render().contains("infergate_engine_ready 0\n"));
        s.record(SizeWarmup {
            size: 4,
            seconds: 0.5,
            bytes: 1024,
        });
        assert!(s.not_ready_reason().contains("1 capture sizes"));
        s.finish(0.75);
        assert!(s.is_ready());
        let text = s.render();
        assert!(text.contains("infergate_engine_ready 1\n"), "{text}");
        assert!(text.contains("infergate_engine_warmup_seconds 0.75\n"));
        assert!(text.contains("infergate_engine_capture_seconds{size=\"4\"} 0.5\n"));
        assert!(text.contains("infergate_engine_capture_bytes{size=\"4\"} 1024\n"));
        let failed = WarmupState::new();
        failed.fail("out of memory".into());
        assert!(!failed.is_ready());
        assert!(failed.not_ready_reason().contains("out of memory"));
    }
}
