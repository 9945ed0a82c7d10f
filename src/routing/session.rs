//! `session`: consistent hash of the session key, so a conversation keeps its worker (and cache).

use super::hash_ring;
use super::least_load::least_loaded;
use super::{Decision, RequestFeatures, RouteReason, RoutingPolicy, WorkerView};

/// Sends a session to the first healthy worker in its hash order; sessionless requests go least
/// loaded.
#[derive(Debug, Default)]
pub struct SessionAffinity;

impl RoutingPolicy for SessionAffinity {
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        let healthy = |w: &WorkerView| w.healthy;
        match req.session_key {
            Some(key) => hash_ring::first(key, workers, healthy)
                .map(|index| Decision::plain(index, RouteReason::Session, req)),
            None => least_loaded(workers, healthy)
                .map(|index| Decision::plain(index, RouteReason::LeastLoad, req)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::features::session_hash;
    use crate::routing::testkit::workers;

    fn session(key: &str) -> RequestFeatures {
        RequestFeatures {
            prefix_hashes: Vec::new(),
            session_key: Some(session_hash(key)),
            ..RequestFeatures::default()
        }
    }

    #[test]
    fn same_session_same_worker_whatever_the_load() {
        let mut ws = workers(6);
        let req = session("alice");
        let first = SessionAffinity.select(&req, &ws);
        assert_eq!(first.map(|d| d.reason), Some(RouteReason::Session));
        for (i, w) in ws.iter_mut().enumerate() {
            w.in_flight = 10 * i as u32;
        }
        assert_eq!(SessionAffinity.select(&req, &ws), first);
    }

    #[test]
    fn unhealthy_home_fails_over_to_next_candidate() {
        let mut ws = workers(6);
        let req = session("bob");
        let key = session_hash("bob");
        let order = hash_ring::candidates(key, &ws, 2);
        ws[order[0]].healthy = false;
        let d = SessionAffinity.select(&req, &ws);
        assert_eq!(d.map(|d| d.index), Some(order[1]));
        for w in &mut ws {
            w.healthy = false;
        }
        assert_eq!(SessionAffinity.select(&req, &ws), None);
    }

    #[test]
    fn no_session_goes_least_loaded() {
        let mut ws = workers(3);
        ws[0].in_flight = 4;
        ws[1].in_flight = 1;
        ws[2].in_flight = 2;
        let req = RequestFeatures::default();
        let d = SessionAffinity.select(&req, &ws);
        assert_eq!(d, Some(Decision::plain(1, RouteReason::LeastLoad, &req)));
    }
}
