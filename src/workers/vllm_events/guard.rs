//! A frame-length guard in front of the ZMQ socket: the `zeromq` crate trusts the lengths a peer
//! declares (a 9-byte frame header claiming an exabyte makes it reserve that much, which aborts
//! the process) and has no message-size limit. So the socket connects to a loopback relay, and
//! the relay forwards the publisher's bytes only while every ZMTP frame it declares fits: a frame
//! or a multipart message past the bound, or too many frames in one message, cuts the connection
//! before the socket sees the header. ZMTP 3 framing: a 64-byte greeting, then frames of a flags
//! byte (bit 0 more, bit 1 long length, bit 2 command), a 1- or 8-byte big-endian length and the
//! body.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// ZMTP 3 greeting length.
const GREETING: u64 = 64;
/// Most frames in one multipart message (vLLM sends 3).
pub const MAX_FRAMES: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Greeting(u64),
    Flags,
    Len {
        long: bool,
        command: bool,
        more: bool,
        need: u8,
        acc: u64,
    },
    Body {
        left: u64,
        more: bool,
    },
}

/// Checks the publisher's byte stream frame by frame.
#[derive(Debug)]
pub struct FrameGuard {
    state: State,
    max_message: u64,
    /// Bytes and frames of the message being read.
    message_bytes: u64,
    message_frames: u32,
}

impl FrameGuard {
    /// A guard allowing messages of at most `max_message` bytes (all frames).
    pub fn new(max_message: u64) -> Self {
        Self {
            state: State::Greeting(GREETING),
            max_message,
            message_bytes: 0,
            message_frames: 0,
        }
    }

    /// Checks the next bytes; `Err` with the refused length once a frame or message is too big.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), u64> {
        while let Some((&b, rest)) = bytes.split_first() {
            match self.state {
                State::Greeting(left) | State::Body { left, .. } => {
                    let n = (bytes.len() as u64).min(left);
                    bytes = &bytes[n as usize..];
                    let left = left - n;
                    self.state = match self.state {
                        State::Greeting(_) if left > 0 => State::Greeting(left),
                        State::Body { more, .. } if left > 0 => State::Body { left, more },
                        _ => State::Flags,
                    };
                    continue;
                }
                State::Flags => {
                    let long = b & 0b10 != 0;
                    self.state = State::Len {
                        long,
                        command: b & 0b100 != 0,
                        more: b & 0b1 != 0,
                        need: if long { 8 } else { 1 },
                        acc: 0,
                    };
                }
                State::Len {
                    long,
                    command,
                    more,
                    need,
                    acc,
                } => {
                    let acc = (acc << 8) | u64::from(b);
                    if need > 1 {
                        self.state = State::Len {
                            long,
                            command,
                            more,
                            need: need - 1,
                            acc,
                        };
                    } else {
                        self.frame(acc, command, more)?;
                        self.state = if acc == 0 {
                            State::Flags
                        } else {
                            State::Body { left: acc, more }
                        };
                    }
                }
            }
            bytes = rest;
        }
        Ok(())
    }

    /// A frame of `len` bytes begins.
    fn frame(&mut self, len: u64, command: bool, more: bool) -> Result<(), u64> {
        if len > self.max_message {
            return Err(len);
        }
        if command {
            return Ok(());
        }
        self.message_bytes += len;
        self.message_frames += 1;
        if self.message_bytes > self.max_message || self.message_frames > MAX_FRAMES {
            return Err(self.message_bytes);
        }
        if !more {
            self.message_bytes = 0;
            self.message_frames = 0;
        }
        Ok(())
    }
}

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct Relay {
    /// `tcp://127.0.0.1:PORT` for the ZMQ socket.
    pub endpoint: String,
    /// Connections cut for a frame past the bound.
    pub cut: Arc<AtomicU64>,
    _tasks: JoinSet<()>,
}

/// Starts a relay to `target` (`tcp://HOST:PORT`) on a loopback port.
pub async fn relay(target: &str, max_message: u64) -> std::io::Result<Relay> {
    let upstream = target.strip_prefix("tcp://").unwrap_or(target).to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("tcp://{}", listener.local_addr()?);
    let cut = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    let counter = cut.clone();
    tasks.spawn(async move {
        // Connections die with this task (their set is dropped with it).
        let mut conns = JoinSet::new();
        while let Ok((down, _)) = listener.accept().await {
            while conns.try_join_next().is_some() {}
            // One socket, one connection: another local process gets nothing through here.
            if !conns.is_empty() {
                continue;
            }
            let Ok(up) = TcpStream::connect(&upstream).await else {
                continue;
            };
            conns.spawn(pipe(
                down,
                up,
                FrameGuard::new(max_message),
                counter.clone(),
            ));
        }
    });
    Ok(Relay {
        endpoint,
        cut,
        _tasks: tasks,
    })
}

/// Copies both ways until either side closes or the guard refuses a frame.
async fn pipe(down: TcpStream, up: TcpStream, mut guard: FrameGuard, cut: Arc<AtomicU64>) {
    let (mut down_r, mut down_w) = down.into_split();
    let (mut up_r, mut up_w) = up.into_split();
    let to_publisher = tokio::io::copy(&mut down_r, &mut up_w);
    let from_publisher = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match up_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Err(len) = guard.feed(&buf[..n]) {
                cut.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    declared = len,
                    "vLLM KV-event publisher sent a frame past the bound; connection cut"
                );
                return;
            }
            if down_w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = to_publisher => {}
        () = from_publisher => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if body.len() > 255 {
            out.push(flags | 0b10);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        } else {
            out.push(flags);
            out.push(body.len() as u8);
        }
        out.extend_from_slice(body);
        out
    }

    fn stream(max: u64) -> (FrameGuard, Vec<u8>) {
        let mut bytes = vec![0xff; 64];
        bytes.extend(frame(0b100, b"\x05READY..."));
        bytes.extend(frame(0b1, b"kv"));
        bytes.extend(frame(0b1, &7u64.to_be_bytes()));
        bytes.extend(frame(0, &[0x90; 300]));
        (FrameGuard::new(max), bytes)
    }

    #[test]
    fn a_vllm_message_passes_however_it_is_split() {
        let (mut g, bytes) = stream(1024);
        assert_eq!(g.feed(&bytes), Ok(()));
        assert_eq!(g.state, State::Flags);
        for chunk in [1, 3, 7, 64, 65] {
            let (mut g, bytes) = stream(1024);
            for piece in bytes.chunks(chunk) {
                assert_eq!(g.feed(piece), Ok(()), "chunks of {chunk}");
            }
            assert_eq!(g.state, State::Flags);
        }
    }

    #[test]
    fn lying_lengths_and_endless_messages_are_refused() {
        // An exabyte frame header, refused before any body.
        let mut g = FrameGuard::new(1024);
        let mut bytes = vec![0xff; 64];
        bytes.push(0b10);
        bytes.extend_from_slice(&(1u64 << 60).to_be_bytes());
        assert_eq!(g.feed(&bytes), Err(1 << 60));
        // Frames each under the bound that add up past it in one message.
        let (mut g, _) = stream(1024);
        let mut bytes = vec![0xff; 64];
        for _ in 0..3 {
            bytes.extend(frame(0b1, &[0; 400]));
        }
        assert_eq!(g.feed(&bytes), Err(1200));
        // Too many small frames in one message.
        let mut g = FrameGuard::new(1024);
        let mut bytes = vec![0xff; 64];
        for _ in 0..=MAX_FRAMES {
            bytes.extend(frame(0b1, b"x"));
        }
        assert!(g.feed(&bytes).is_err());
        // Separate messages each under the bound pass.
        let (mut g, _) = stream(1024);
        let mut bytes = vec![0xff; 64];
        for _ in 0..10 {
            bytes.extend(frame(0, &[0; 1000]));
        }
        assert_eq!(g.feed(&bytes), Ok(()));
    }
}
