//! Sticky version assignment. A sticky key hashes (xxh3, fixed salt) to a point in 0..10000;
//! the versions own contiguous ranges of that line in their order, each sized by its weight, so
//! w% of keys land on a version with weight w. With two versions, moving weight from one to the
//! other moves only keys from the one that lost weight to the one that gained it, and a version
//! set to 0 sends all its keys to the other: a session changes version only when the split
//! itself changes against it (a promotion past its point, or a rollback).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::spec::StickyKey;

/// Seed of the point hash, so the split is independent of other hashes of the same key.
const SALT: u64 = 0x6361_6e61_7279_5f31;
/// Resolution of the split: points per 100%.
const POINTS: u64 = 10_000;

/// The point of `key` on the split line, in 0..10000.
pub fn point(key: u64) -> u64 {
    xxh3_64_with_seed(&key.to_le_bytes(), SALT) % POINTS
}

/// Index of the version `key` lands on. Weights are percents summing to 100 (any other total
/// is scaled to the line); an empty or all-zero slice yields 0.
pub fn choose(spec_weights: &[(String, u32)], key: u64) -> usize {
    let total: u64 = spec_weights.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return 0;
    }
    let p = point(key);
    let mut upto = 0u64;
    let mut last_weighted = 0;
    for (i, (_, w)) in spec_weights.iter().enumerate() {
        if *w == 0 {
            continue;
        }
        upto += u64::from(*w);
        last_weighted = i;
        if p < upto * POINTS / total {
            return i;
        }
    }
    last_weighted
}

/// The 64-bit sticky key of a text key (session id, user or tenant).
pub fn key_of(text: &str) -> u64 {
    xxh3_64(text.as_bytes())
}

impl StickyKey {
    /// The text that keys a request: for `Session` the `x-session-id` header, else the body's
    /// `user`, else the request id; for `User` the user, else the request id; for `Tenant` the
    /// tenant. Without a session or user, each request is split by weight on its own (keyed by
    /// its id, so one request is never split twice); keying on the tenant instead would send a
    /// whole tenant to one version. Empty values count as absent; `None` when none is present.
    pub fn pick<'a>(
        self,
        (session, user): (Option<&'a str>, Option<&'a str>),
        request: Option<&'a str>,
        tenant: Option<&'a str>,
    ) -> Option<&'a str> {
        let present = |v: Option<&'a str>| v.filter(|s| !s.is_empty());
        match self {
            StickyKey::Session => present(session).or(present(user)).or(present(request)),
            StickyKey::User => present(user).or(present(request)),
            StickyKey::Tenant => present(tenant),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: u64 = 100_000;

    fn split(stable: u32, canary: u32) -> Vec<(String, u32)> {
        vec![("stable".into(), stable), ("canary".into(), canary)]
    }

    #[test]
    fn shares_follow_the_weights() {
        for (s, c) in [(95, 5), (99, 1), (75, 25), (50, 50), (0, 100)] {
            let w = split(s, c);
            let on_canary = (0..KEYS).filter(|&k| choose(&w, k) == 1).count();
            let share = on_canary as f64 * 100.0 / KEYS as f64;
            assert!((share - f64::from(c)).abs() < 0.5, "{c}% → {share:.2}%");
        }
    }

    #[test]
    fn a_ramp_moves_keys_only_from_stable_to_canary() {
        let steps = [0, 1, 5, 25, 50, 100];
        for pair in steps.windows(2) {
            let (before, after) = (split(100 - pair[0], pair[0]), split(100 - pair[1], pair[1]));
            for k in 0..KEYS {
                let (a, b) = (choose(&before, k), choose(&after, k));
                assert!(a == b || (a == 0 && b == 1), "key {k} moved {a} → {b}");
            }
        }
    }

    #[test]
    fn a_rollback_sends_the_canarys_keys_to_stable() {
        for canary_first in [false, true] {
            let order = |s: u32, c: u32| {
                let mut w = split(s, c);
                if canary_first {
                    w.reverse();
                }
                w
            };
            let stable = usize::from(canary_first);
            let (ramped, rolled) = (order(75, 25), order(100, 0));
            for k in 0..10_000 {
                assert_eq!(choose(&rolled, k), stable);
                if choose(&ramped, k) == stable {
                    assert_eq!(choose(&rolled, k), stable);
                }
            }
        }
    }

    #[test]
    fn assignment_is_deterministic() {
        let w = split(50, 50);
        for k in 0..1_000 {
            assert_eq!(choose(&w, k), choose(&w, k));
            assert_eq!(point(k), point(k));
            assert!(point(k) < POINTS);
        }
        assert_eq!(key_of("session-1"), key_of("session-1"));
        assert_ne!(key_of("session-1"), key_of("session-2"));
        assert_eq!(choose(&[], 7), 0);
        assert_eq!(choose(&split(0, 0), 7), 0);
    }

    #[test]
    fn sticky_keys_fall_back_in_order() {
        let (s, u, r, t) = (Some("sess"), Some("user"), Some("req"), Some("tenant"));
        assert_eq!(StickyKey::Session.pick((s, u), r, t), Some("sess"));
        assert_eq!(StickyKey::Session.pick((Some(""), u), r, t), Some("user"));
        // No session key: the request alone decides, not its tenant.
        assert_eq!(StickyKey::Session.pick((None, None), r, t), Some("req"));
        assert_eq!(StickyKey::User.pick((s, u), r, t), Some("user"));
        assert_eq!(StickyKey::User.pick((s, None), r, t), Some("req"));
        assert_eq!(StickyKey::Tenant.pick((s, u), r, t), Some("tenant"));
        assert_eq!(StickyKey::Tenant.pick((s, u), r, None), None);
    }
}
