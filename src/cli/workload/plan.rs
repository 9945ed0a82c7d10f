//! Turning a workload into its request plan: arrival times from the schedule (or the trace, or
//! none for a closed loop) paired with request shapes. `Workload::requests` streams the plan, so
//! hour-long simulations need not hold it all; `plan` collects it.

use std::collections::HashMap;
use std::time::Duration;

use infergate_engine::tokenizer::SimTokenizer;

use super::arrivals::{Schedule, Times, trace_speedup};
use super::model::{
    Arrival, Overrides, PlannedRequest, TraceEntry, TraceGroup, TracePrompt, Workload,
};
use super::rng::Rng;
use super::shape::{Shaper, fresh_words};

impl Workload {
    /// The whole plan, in send order (ids 0, 1, …).
    pub fn plan(&self, o: &Overrides) -> Result<Vec<PlannedRequest>, String> {
        Ok(self.requests(o)?.collect())
    }

    /// The plan as a stream, identical to `plan` but built one request at a time.
    pub fn requests(&self, o: &Overrides) -> Result<Requests, String> {
        let seed = o.seed.unwrap_or(self.seed);
        let duration = o.duration.unwrap_or(self.duration);
        if let Some(rate) = o.rate
            && !(rate.is_finite() && rate >= 0.0)
        {
            return Err(format!("rate must be a number ≥ 0, got {rate}"));
        }
        let tokenizer = SimTokenizer::shared()?;
        let words = tokenizer.word_tokens();
        let source = match &self.arrival {
            Arrival::Closed { concurrency } => {
                if o.rate.is_some() {
                    return Err(format!(
                        "workload `{}` is a closed loop ({concurrency} clients): a rate does not apply",
                        self.name
                    ));
                }
                // One request per client per second of the run, unless `requests` caps it.
                let planned = (*concurrency as f64 * duration.as_secs_f64()).ceil() as u64;
                Source::Closed(planned.max(*concurrency as u64))
            }
            Arrival::Trace(trace) => Source::Trace(TraceReplay {
                entries: trace.entries.clone().into_iter(),
                speedup: trace_speedup(trace, o.rate),
                end: duration,
                histories: HashMap::new(),
                prefixes: HashMap::new(),
                seed,
                tokenizer,
                rng: Rng::derive(seed, 3),
            }),
            open => match Schedule::of(open, o.rate) {
                Some(schedule) => Source::Open(schedule.times(duration, Rng::derive(seed, 1))),
                None => return Err("no arrival schedule".into()),
            },
        };
        let shaper = match (&self.arrival, &self.mix) {
            (Arrival::Trace(_), _) => None,
            (_, Some(mix)) => Some(Shaper::new(mix.clone(), seed, words)),
            (_, None) => return Err(format!("workload `{}` has no request mix", self.name)),
        };
        Ok(Requests {
            next_id: 0,
            limit: self.requests,
            source,
            shaper,
        })
    }

    /// The plan of a live closed loop: like `requests`, but the run's duration does not cap the
    /// count (only `requests:` does), because live clients stop on the clock however fast the
    /// answers come. Other arrivals are as `requests` builds them.
    pub fn open_ended(&self, o: &Overrides) -> Result<Requests, String> {
        let mut requests = self.requests(o)?;
        if let Source::Closed(n) = &mut requests.source {
            *n = u64::MAX;
        }
        Ok(requests)
    }

    /// The number of clients of a closed loop; `None` for open-loop arrivals and traces.
    pub fn concurrency(&self) -> Option<usize> {
        match self.arrival {
            Arrival::Closed { concurrency } => Some(concurrency),
            _ => None,
        }
    }
}

/// A workload's requests in send order; see `Workload::requests`.
pub struct Requests {
    next_id: u64,
    limit: Option<u64>,
    source: Source,
    shaper: Option<Shaper>,
}

/// Where send times come from.
enum Source {
    /// An open-loop schedule.
    Open(Times),
    /// A closed loop: this many requests, all at time zero.
    Closed(u64),
    /// A recorded trace.
    Trace(TraceReplay),
}

impl Iterator for Requests {
    type Item = PlannedRequest;

    fn next(&mut self) -> Option<PlannedRequest> {
        if self.limit.is_some_and(|l| self.next_id >= l) {
            return None;
        }
        let id = self.next_id;
        let request = match &mut self.source {
            Source::Trace(replay) => replay.next_request(id)?,
            source => {
                let at = match source {
                    Source::Open(times) => times.next()?,
                    Source::Closed(n) if id < *n => Duration::ZERO,
                    _ => return None,
                };
                let shape = self.shaper.as_mut()?.next_shape();
                PlannedRequest {
                    id,
                    at,
                    tenant: shape.tenant,
                    class: shape.class,
                    session: shape.session,
                    group: shape.group,
                    prompt: shape.prompt,
                    output_tokens: shape.output_tokens,
                    features: None,
                }
            }
        };
        self.next_id += 1;
        Some(request)
    }
}

/// Replays trace entries, scaling time and keeping each session's history.
struct TraceReplay {
    entries: std::vec::IntoIter<TraceEntry>,
    speedup: f64,
    end: Duration,
    histories: HashMap<String, Vec<u32>>,
    /// Each prefix group's shared tokens, drawn once (the longest any member asked for).
    prefixes: HashMap<usize, Vec<u32>>,
    seed: u64,
    tokenizer: &'static SimTokenizer,
    rng: Rng,
}

impl TraceReplay {
    /// The first `g.tokens` tokens of group `g`'s prefix, the same for every member: words
    /// drawn from the group's own stream, so a longer member extends a shorter one's.
    fn group_prefix(&mut self, g: TraceGroup) -> Vec<u32> {
        let words = self.tokenizer.word_tokens();
        let seed = self.seed;
        let prefix = self.prefixes.entry(g.id).or_default();
        if prefix.len() < g.tokens as usize {
            let mut rng = Rng::derive(seed ^ 0x9e37_79b9, 4 + g.id as u64);
            let mut longer = Vec::new();
            fresh_words(&mut longer, g.tokens, words, &mut rng);
            *prefix = longer;
        }
        prefix[..(g.tokens as usize).min(prefix.len())].to_vec()
    }

    /// The next entry as a request, or `None` past the end of the trace or the run.
    fn next_request(&mut self, id: u64) -> Option<PlannedRequest> {
        let entry = self.entries.next()?;
        let at = Duration::try_from_secs_f64(entry.at.as_secs_f64() / self.speedup).ok()?;
        if at >= self.end {
            return None;
        }
        let history = entry
            .session
            .as_ref()
            .and_then(|s| self.histories.remove(s));
        let prompt = match entry.prompt {
            TracePrompt::Text(text) => self.tokenizer.encode(&text),
            TracePrompt::Tokens(n) => {
                // A session's recorded length includes its history: reuse it and fill the rest.
                let mut prompt = history
                    .filter(|h| h.len() <= n as usize)
                    .or_else(|| entry.group.map(|g| self.group_prefix(g)))
                    .unwrap_or_default();
                let fill = n.saturating_sub(prompt.len() as u32);
                fresh_words(
                    &mut prompt,
                    fill,
                    self.tokenizer.word_tokens(),
                    &mut self.rng,
                );
                prompt
            }
        };
        if let Some(session) = &entry.session {
            let mut next = prompt.clone();
            let words = self.tokenizer.word_tokens();
            fresh_words(&mut next, entry.output_tokens, words, &mut self.rng);
            self.histories.insert(session.clone(), next);
        }
        Some(PlannedRequest {
            id,
            at,
            tenant: entry.tenant,
            class: entry.class,
            session: entry.session,
            group: entry.group.map(|g| g.id),
            prompt,
            output_tokens: entry.output_tokens,
            features: entry.features,
        })
    }
}

/// The prompt as text (for HTTP clients); it re-tokenizes to about the same length. Empty if
/// the tokenizer cannot be built.
pub fn prompt_text(req: &PlannedRequest) -> String {
    SimTokenizer::shared().map_or_else(|_| String::new(), |t| t.decode(&req.prompt))
}
