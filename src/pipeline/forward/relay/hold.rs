//! A whole (non-streamed) answer is held back until its last byte before its head goes to the
//! client: a worker that breaks the body off (shorter than its Content-Length, a reset, a
//! silence past the idle timeout) then gets the client a 502 (504) instead of a truncated 200.
//! Holding is bounded: past [`HOLD_MAX_BYTES`] the answer starts flowing, and a failure after
//! that can only cut the connection, which the client sees as an incomplete body (its
//! Content-Length or chunked framing unmet), never as a whole one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, SizeHint};

use super::body::ProxyBody;
use crate::error::{BoxError, GatewayError};

/// Most bytes of one answer held back; chat and completion answers are far smaller, a large
/// embeddings answer may pass it. The usage tap scans a body up to the same size.
pub const HOLD_MAX_BYTES: usize = 4 * 1024 * 1024;

/// How holding an answer ended.
pub enum Held {
    /// Ready to send: whole, or (past the bound) its first part and the rest to stream.
    Ready(HeldBody),
    /// The worker failed it before anything was sent: the client's answer is this error (the
    /// body's end already accounted it, with this status).
    Failed(GatewayError),
}

/// Reads `body` to its end, or to `max` bytes.
pub async fn hold(body: ProxyBody, max: usize) -> Held {
    let mut body = body.held();
    let mut frames = VecDeque::new();
    let mut held = 0usize;
    loop {
        match body.frame().await {
            None => return Held::Ready(HeldBody { frames, rest: None }),
            // Trailers are dropped: a held answer is sent as plain data.
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    held += data.len();
                    frames.push_back(data);
                    if held > max {
                        return Held::Ready(HeldBody {
                            frames,
                            rest: Some(Box::new(body)),
                        });
                    }
                }
            }
            Some(Err(e)) => {
                return Held::Failed(match e.downcast::<GatewayError>() {
                    Ok(err) => *err,
                    Err(other) => GatewayError::UpstreamUnavailable(other.to_string()),
                });
            }
        }
    }
}

/// A held answer: its frames, then the rest of the upstream body when it outgrew the bound.
pub struct HeldBody {
    frames: VecDeque<Bytes>,
    /// Boxed: only an answer past the bound has one.
    rest: Option<Box<ProxyBody>>,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(data) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest.as_mut()).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self.frames.iter().map(|f| f.len() as u64).sum();
        match &self.rest {
            None => SizeHint::with_exact(held),
            Some(_) => {
                let mut hint = SizeHint::new();
                hint.set_lower(held);
                hint
            }
        }
    }
}
