//! The simulator's client side of a sequence: a sink that notes each engine event under the
//! request's id in its worker's shared log, for the fleet to timestamp when the step ends. A
//! request of several sequences (`n` choices) ends once, when its last sequence does, with
//! their totals (`FinishInfo::absorb`, as its flight record counts them), or at its first error.

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
    /// With sibling sequences: the request's shared state, and this sequence's index in it.
    group: Option<(Arc<Mutex<Group>>, usize)>,
}

/// The sequences of one request: each one's end so far, and whether one failed.
#[derive(Debug, Default)]
struct Group {
    ended: Vec<Option<FinishInfo>>,
    failed: bool,
}

impl RecordingSink {
    /// A sink for request `id` writing to `log`.
    pub(super) fn new(id: u64, log: NoteLog) -> Self {
        Self {
            id,
            log,
            group: None,
        }
    }

    /// The sinks of request `id`'s `size` sequences (one plain sink when `size` is 1).
    pub(super) fn group(id: u64, log: &NoteLog, size: usize) -> Vec<Self> {
        if size <= 1 {
            return vec![Self::new(id, log.clone())];
        }
        let group = Arc::new(Mutex::new(Group {
            ended: vec![None; size],
            failed: false,
        }));
        (0..size)
            .map(|i| Self {
                id,
                log: log.clone(),
                group: Some((group.clone(), i)),
            })
            .collect()
    }

    /// The note the request's client sees for this sequence's `event`, if any.
    fn note(&self, event: SeqEvent) -> Option<Note> {
        let Some((group, index)) = &self.group else {
            return Some(match event {
                SeqEvent::Tokens(tokens) => Note::Tokens(tokens.len()),
                SeqEvent::Finished(info) => Note::Finished(info),
                SeqEvent::Error(_) => Note::Error,
            });
        };
        let mut g = group.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            SeqEvent::Tokens(tokens) => Some(Note::Tokens(tokens.len())),
            _ if g.failed => None,
            SeqEvent::Error(_) => {
                g.failed = true;
                Some(Note::Error)
            }
            SeqEvent::Finished(info) => {
                if let Some(slot) = g.ended.get_mut(*index) {
                    *slot = Some(*info);
                }
                // The first sequence's prompt and cache hits stand for the request's.
                let mut ended = g.ended.iter().copied();
                let mut total = ended.next().flatten()?;
                for info in ended {
                    total.absorb(&info?);
                }
                Some(Note::Finished(Box::new(total)))
            }
        }
    }
}

impl EventSink for RecordingSink {
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        if let Some(note) = self.note(event) {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((self.id, note));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn info(steps: u32) -> Box<FinishInfo> {
        Box::new(FinishInfo {
            completion_tokens: steps as usize,
            graph_steps: steps,
            batch_min: 1,
            batch_max: 2,
            prompt_tokens: 9,
            ..FinishInfo::default()
        })
    }

    #[test]
    fn a_group_ends_once_with_its_sequences_totals() {
        let log = NoteLog::default();
        let mut sinks = RecordingSink::group(4, &log, 2);
        let mut notes = Vec::new();
        sinks[1].try_send(SeqEvent::Finished(info(3))).unwrap();
        take_notes(&log, &mut notes);
        assert!(notes.is_empty(), "one sequence still runs");
        sinks[0].try_send(SeqEvent::Finished(info(5))).unwrap();
        take_notes(&log, &mut notes);
        let [(4, Note::Finished(total))] = notes.as_slice() else {
            panic!("{notes:?}");
        };
        assert_eq!((total.graph_steps, total.completion_tokens), (8, 8));
        assert_eq!(total.prompt_tokens, 9);

        let mut failing = RecordingSink::group(5, &log, 3);
        failing[0].try_send(SeqEvent::Error("full".into())).unwrap();
        failing[1].try_send(SeqEvent::Error("full".into())).unwrap();
        failing[2].try_send(SeqEvent::Finished(info(1))).unwrap();
        take_notes(&log, &mut notes);
        assert_eq!(notes, vec![(5, Note::Error)], "one error ends it");

        let single = RecordingSink::group(6, &log, 1);
        assert!(single[0].group.is_none());
    }
}
