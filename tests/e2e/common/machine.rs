//! The machine as a shared resource of the one test binary: tests that load the CPU share it
//! (read); tests whose deadlines or numbers a busy neighbour would break (a real model's forward
//! passes, the live-vs-sim latency comparison) take it whole (write) and run alone among them.

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static MACHINE: RwLock<()> = RwLock::const_new(());

/// A share of the machine, taken by tests whose numbers do not depend on wall-clock timing.
pub async fn shared_machine() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// The whole machine, for timing-sensitive or CPU-bound tests.
pub async fn whole_machine() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().await
}
