//! Client connections counted against the live `limits:`, in all and per client IP.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::config::ConnectionLimits;
use crate::gateway::Gateway;
use crate::metrics::GatewayMetrics;

/// Open client connections, in all and per client IP, against the live `limits:`.
#[derive(Default)]
pub(super) struct ConnectionCounts {
    total: u32,
    per_ip: HashMap<IpAddr, u32>,
}

/// Holds one connection's place in [`ConnectionCounts`] until dropped.
pub(super) struct ConnectionSlot {
    counts: Arc<Mutex<ConnectionCounts>>,
    ip: IpAddr,
    metrics: Arc<GatewayMetrics>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
        self.metrics.connections_open.set(i64::from(c.total));
    }
}

/// Takes a connection slot for `ip`, or says which cap refused it.
pub(super) fn take_slot(
    gw: &Arc<Gateway>,
    counts: &Arc<Mutex<ConnectionCounts>>,
    ip: IpAddr,
    limits: ConnectionLimits,
) -> Result<ConnectionSlot, &'static str> {
    let mut c = counts
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if c.total >= limits.max_connections {
        return Err("max_connections");
    }
    let n = c.per_ip.entry(ip).or_insert(0);
    if *n >= limits.max_connections_per_ip {
        return Err("max_connections_per_ip");
    }
    *n += 1;
    c.total += 1;
    gw.metrics.connections_open.set(i64::from(c.total));
    Ok(ConnectionSlot {
        counts: counts.clone(),
        ip,
        metrics: gw.metrics.clone(),
    })
}
