//! The simulator's client side of a sequence: a sink that notes each engine event under the
//! request's id in its worker's shared log, for the fleet to timestamp when the step ends.

use std::sync::{Arc, Mutex};

use infergate_engine::sequence::{EventSink, FinishInfo, SendError, SeqEvent};

/// What a request's client saw, reduced to what the report needs.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Note {
    /// A chunk of this many tokens.
    Tokens(usize),
    /// The sequence ended normally (boxed, as the engine sends it: its batch histogram makes
    /// it large).
    Finished(Box<FinishInfo>),
    /// The engine refused the request (it can never fit the KV cache).
    Error,
}

/// Notes of one worker, in the order its engine emitted them: (request id, note).
pub(super) type NoteLog = Arc<Mutex<Vec<(u64, Note)>>>;

/// An [`EventSink`] that never fills and never closes; events land in the worker's log.
/// `EventSink` must be `Send`, hence the mutex (uncontended: the simulation is single-threaded).
pub(super) struct RecordingSink {
    id: u64,
    log: NoteLog,
}

impl RecordingSink {
    /// A sink for request `id` writing to `log`.
    pub(super) fn new(id: u64, log: NoteLog) -> Self {
        Self { id, log }
    }
}

impl EventSink for RecordingSink {
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        let note = match event {
            SeqEvent::Tokens(tokens) => Note::Tokens(tokens.len()),
            SeqEvent::Finished(info) => Note::Finished(info),
            SeqEvent::Error(_) => Note::Error,
        };
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.push((self.id, note));
        Ok(())
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// Moves every note out of `log` into `into` (which is cleared first), keeping both allocations.
pub(super) fn take_notes(log: &NoteLog, into: &mut Vec<(u64, Note)>) {
    into.clear();
    let mut guard = log.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::swap(&mut *guard, into);
}
