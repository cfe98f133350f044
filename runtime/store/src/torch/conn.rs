//! One connection to a PyTorch TCPStore: the handshake, one request at a
//! time, and waits that can be cancelled.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wire::{self, Answer, Expect, Query};
use crate::error::StoreError;

/// Bytes asked of one read.
const READ_CHUNK: usize = 64 * 1024;
/// How long a refused connection waits before it tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A validated connection. Requests go one at a time: the protocol's
/// replies carry no ids, so a reply belongs to the oldest request waiting
/// for one.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    /// Received bytes not yet decoded.
    inbuf: Vec<u8>,
    /// Request bytes, reused.
    outbuf: Vec<u8>,
    addr: String,
}

/// How a [`Conn::wait`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// Every key exists.
    Ready,
    /// The timeout expired first; the server has dropped the wait.
    TimedOut,
}

pub(crate) fn conn_err(addr: &str, cause: impl std::fmt::Display) -> StoreError {
    StoreError::Connection {
        addr: addr.to_owned(),
        cause: cause.to_string(),
    }
}

/// A small nonce for the handshake's ping.
fn nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

impl Conn {
    /// Connects to `addr`, retrying refused or unreachable attempts until
    /// `connect_deadline`, then validates the connection and pings the
    /// server, whose echo must come within `reply_timeout`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Connection`] if no connection could be made in time
    /// (with the last cause), [`StoreError::Protocol`] if the peer does
    /// not answer the ping as a PyTorch TCPStore does.
    pub(crate) async fn open(
        addr: &str,
        connect_deadline: Instant,
        reply_timeout: Duration,
    ) -> Result<Conn, StoreError> {
        let stream = loop {
            let left = connect_deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(1)), TcpStream::connect(addr))
                .await
            {
                Ok(Ok(s)) => break s,
                Ok(Err(e)) if Instant::now() + RETRY_PAUSE < connect_deadline => {
                    tracing::trace!(addr, "PyTorch TCPStore not reachable yet: {e}");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(conn_err(addr, e)),
                Err(_) => return Err(conn_err(addr, "connect timed out")),
            }
        };
        stream
            .set_nodelay(true)
            .map_err(|e| conn_err(addr, format!("TCP_NODELAY: {e}")))?;
        let mut conn = Conn {
            stream,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            addr: addr.to_owned(),
        };
        let deadline = Instant::now() + reply_timeout;
        conn.send(&Query::Validate).await?;
        let nonce = nonce();
        let echo = match conn.call(&Query::Ping(nonce), deadline).await {
            Ok(a) => a.into_u32()?,
            Err(StoreError::Connection { cause, .. }) => {
                return Err(StoreError::Protocol(format!(
                    "{addr} does not answer as a PyTorch TCPStore (validate and ping, PyTorch 2.3 or later): {cause}"
                )))
            }
            Err(e) => return Err(e),
        };
        if echo != nonce {
            return Err(StoreError::Protocol(format!(
                "{addr} answered the ping with {echo:#x}, not {nonce:#x}: not a PyTorch TCPStore"
            )));
        }
        Ok(conn)
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one request. The caller has checked it against the limits
    /// ([`Query::check`]).
    pub(crate) async fn send(&mut self, q: &Query<'_>) -> Result<(), StoreError> {
        self.outbuf.clear();
        q.encode(&mut self.outbuf);
        let r = self.stream.write_all(&self.outbuf).await;
        if self.outbuf.capacity() > READ_CHUNK {
            self.outbuf = Vec::new();
        }
        r.map_err(|e| conn_err(&self.addr, e))
    }

    /// Reads one reply of kind `expect`, until `deadline`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Connection`] when the connection closes or the
    /// deadline passes first; decoding errors as [`wire::decode`].
    pub(crate) async fn recv(
        &mut self,
        expect: Expect,
        deadline: Instant,
    ) -> Result<Answer, StoreError> {
        loop {
            if let Some((answer, used)) = wire::decode(expect, &self.inbuf)? {
                self.inbuf.drain(..used);
                return Ok(answer);
            }
            let got = self.read_until(deadline).await?;
            if got.is_none() {
                return Err(conn_err(
                    &self.addr,
                    "no reply within the request timeout: the PyTorch TCPStore stopped answering",
                ));
            }
        }
    }

    /// Reads what the socket has, until `deadline`. `Ok(None)` when the
    /// deadline passed first.
    async fn read_until(&mut self, deadline: Instant) -> Result<Option<usize>, StoreError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inbuf.reserve(READ_CHUNK);
        match tokio::time::timeout(left, self.stream.read_buf(&mut self.inbuf)).await {
            Err(_) => Ok(None),
            Ok(Ok(0)) => Err(conn_err(
                &self.addr,
                "the PyTorch TCPStore closed the connection (it closes it on a request it refuses: a key over 8 KiB, a value over 8 MiB, an add to a value that is not an integer)",
            )),
            Ok(Ok(n)) => Ok(Some(n)),
            Ok(Err(e)) => Err(conn_err(&self.addr, e)),
        }
    }

    /// Sends a request with a reply and reads it, until `deadline`.
    pub(crate) async fn call(
        &mut self,
        q: &Query<'_>,
        deadline: Instant,
    ) -> Result<Answer, StoreError> {
        self.send(q).await?;
        self.recv(q.expect(), deadline).await
    }

    /// Waits until every key in `keys` exists, at most `timeout`. On
    /// timeout it cancels the wait on the server (`CANCEL_WAIT`) and reads
    /// the server's acknowledgement within `reply_timeout`, so the
    /// connection can serve the next request.
    pub(crate) async fn wait(
        &mut self,
        keys: &[&str],
        timeout: Duration,
        reply_timeout: Duration,
    ) -> Result<Waited, StoreError> {
        let q = Query::Wait(keys);
        self.send(&q).await?;
        let deadline = Instant::now().checked_add(timeout);
        let first = match deadline {
            Some(d) => self.recv_byte_or_timeout(d).await?,
            // A timeout too long to represent: wait for the reply.
            None => Some(self.recv(Expect::Byte, far_future()).await?.into_byte()?),
        };
        match first {
            Some(wire::STOP_WAITING) => return Ok(Waited::Ready),
            Some(b) => return Err(unexpected_wait_reply(b)),
            None => {}
        }
        self.send(&Query::CancelWait).await?;
        let ack_deadline = Instant::now() + reply_timeout;
        // The keys may have appeared just before the server saw the cancel:
        // its STOP_WAITING then comes before the acknowledgement.
        let mut ready = false;
        loop {
            match self.recv(Expect::Byte, ack_deadline).await?.into_byte()? {
                wire::WAIT_CANCELED => {
                    return Ok(if ready {
                        Waited::Ready
                    } else {
                        Waited::TimedOut
                    })
                }
                wire::STOP_WAITING if !ready => ready = true,
                b => return Err(unexpected_wait_reply(b)),
            }
        }
    }

    /// One byte, or `None` if `deadline` passes first.
    async fn recv_byte_or_timeout(&mut self, deadline: Instant) -> Result<Option<u8>, StoreError> {
        loop {
            if let Some((a, used)) = wire::decode(Expect::Byte, &self.inbuf)? {
                self.inbuf.drain(..used);
                return a.into_byte().map(Some);
            }
            if self.read_until(deadline).await?.is_none() {
                return Ok(None);
            }
        }
    }

    /// True if nothing is buffered: the connection is between requests.
    pub(crate) fn is_idle(&self) -> bool {
        self.inbuf.is_empty()
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

fn unexpected_wait_reply(b: u8) -> StoreError {
    StoreError::Protocol(format!(
        "PyTorch TCPStore answered a wait with {b}, neither STOP_WAITING (0) nor WAIT_CANCELED (1)"
    ))
}
