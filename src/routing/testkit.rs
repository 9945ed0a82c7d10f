//! Test doubles shared by the policy tests: a seeded generator and hand-built worker views.

use super::WorkerView;
use super::features::session_hash;

/// A tiny deterministic generator (splitmix64), so tests need no dependency.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        let z = super::hash_ring::mix(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z
    }

    /// A pseudo-random value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A healthy idle worker keyed like the gateway keys it (hash of its URL).
pub fn worker(i: usize) -> WorkerView {
    WorkerView {
        key: session_hash(&format!("http://10.0.0.{i}:8000")),
        healthy: true,
        in_flight: 0,
        waiting: 0.0,
        running: 0.0,
        polled_in_flight: 0,
        kv_usage: 0.0,
        pending_prefill: 0,
        kv_capacity: None,
        kv_protected: None,
    }
}

/// `n` healthy idle workers.
pub fn workers(n: usize) -> Vec<WorkerView> {
    (0..n).map(worker).collect()
}
