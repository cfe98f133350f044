//! The store client's connection: what the caller's thread and the driver
//! task on chorus's I/O threads share, the caller's path (write the request
//! itself, read its own reply while it is alone in flight), and the driver
//! (flush what the socket did not take, read what nobody else read, fail
//! requests on connection loss or when their reply is overdue).
//!
//! Every byte written or read goes through [`Wire`] under its lock, so
//! frames keep their order whichever side moves them; the requests and
//! their results live in a [`Calls`] table (chorus-core, loom-checked). The
//! caller reads and writes a duplicate of the socket's descriptor with
//! plain non-blocking syscalls; the driver uses tokio's readiness on the
//! original. A read by one side that leaves the other's readiness stale
//! costs that side one `recv` that returns `WouldBlock`, never a lost
//! wake-up: new bytes always raise a new edge.

use std::future::Future;
use std::io::{self, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::calls::Calls;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::io::{InBuf, OutBuf};
use crate::wire::{self, FrameStatus, Reply};
use chorus_core::sync::lock;

/// How long a request's future keeps reading the socket itself, yielding
/// to its executor between reads, before it parks and leaves the reply to
/// the driver: a little more than a loopback round trip through a server
/// thread that has to wake up, so that an answer the server gives at once
/// is read without a wake-up of chorus's I/O thread, and a `get` that
/// waits for its key costs at most this much spinning.
pub(crate) const OWN_READ_BUDGET: Duration = Duration::from_micros(100);

/// Store requests of this process awaiting their replies, over every
/// connection. A future reads its own reply only while it is the only one:
/// with more in flight (many clients, or many tasks on one), the I/O
/// threads have work to do and a spinning caller would take a core from
/// them.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// The driver's timer never sleeps less than this (see
/// [`Calls::expire`]): a request timeout shorter than it still holds, at
/// the cost of waking the driver for each such request.
pub(crate) const MIN_TIMER_LEAD: Duration = Duration::from_millis(10);

/// Bytes moving on the connection.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    /// Requests the socket has not taken yet (flushed by the driver).
    pub(crate) out: OutBuf,
    /// Replies received, not yet dispatched.
    pub(crate) inbuf: InBuf,
    /// Every [`TcpStore`](crate::TcpStore) handle is gone: the driver ends
    /// once `out` is written.
    pub(crate) closed: bool,
}

/// What the caller's side and the driver share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The server address, for errors.
    pub(crate) addr: String,
    /// The requests awaiting replies.
    pub(crate) calls: Calls<Reply, StoreError>,
    /// The bytes; lock order: `wire`, then `calls`.
    pub(crate) wire: Mutex<Wire>,
    /// The caller's descriptor of the socket (a duplicate of the driver's).
    pub(crate) raw: std::net::TcpStream,
    /// Wakes the driver: bytes to flush, an earlier deadline, or the end.
    pub(crate) notify: Notify,
    /// The driver's timer lead: the request timeout, at least
    /// [`MIN_TIMER_LEAD`].
    pub(crate) lead: Duration,
}

impl Shared {
    /// Registers request `id` and writes its `frame`: from the caller's
    /// thread if no other request is in flight, else into the queue of
    /// requests to write. Returns true if the request is the only one in
    /// flight and fully written: its future may then read its reply itself.
    ///
    /// # Errors
    ///
    /// The error that ended the connection, or the write's.
    pub(crate) fn submit(
        &self,
        id: u64,
        frame: &[u8],
        deadline: Instant,
    ) -> Result<bool, StoreError> {
        let mut w = lock(&self.wire);
        let reg = self.calls.register(id, deadline)?;
        let mut wake = reg.wake_driver;
        if reg.alone && w.out.pending() == 0 {
            let n = match write_now(&self.raw, frame) {
                Ok(n) => n,
                Err(e) => {
                    drop(w);
                    self.end(conn_err(&self.addr, format!("write failed: {e}")));
                    return Err(self
                        .calls
                        .ended()
                        .unwrap_or_else(|| conn_err(&self.addr, "connection closed")));
                }
            };
            if n < frame.len() {
                w.out.buf().extend_from_slice(&frame[n..]);
                wake = true;
            }
        } else {
            // Others are in flight: queue it, so that requests made
            // together leave in one write (by the future reading its own
            // reply, if there is one, else by the driver, woken when the
            // queue fills).
            wake |= w.out.pending() == 0;
            w.out.buf().extend_from_slice(frame);
        }
        let alone = reg.alone && w.out.pending() == 0;
        drop(w);
        if wake {
            self.notify.notify_one();
        }
        Ok(alone)
    }

    /// Writes queued requests and reads what the socket holds now, from
    /// the caller's thread, and dispatches the complete replies; skipped
    /// while the driver holds the bytes.
    fn read_now(&self) {
        let Ok(mut w) = self.wire.try_lock() else {
            return;
        };
        if w.out.pending() > 0 {
            if let Err(e) = w.out.flush_to(&mut &self.raw) {
                drop(w);
                self.end(conn_err(&self.addr, format!("write failed: {e}")));
                return;
            }
        }
        let mut replies = Vec::new();
        let ended = match w.inbuf.read_from(&mut &self.raw) {
            Ok(0) => Some(conn_err(&self.addr, "server closed the connection")),
            Ok(_) => parse(&mut w.inbuf, &mut replies).err(),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                None
            }
            Err(e) => Some(conn_err(&self.addr, format!("read failed: {e}"))),
        };
        drop(w);
        complete(&self.calls, replies);
        if let Some(e) = ended {
            self.end(e);
        }
    }

    /// Ends the connection with `e` and tells the driver.
    fn end(&self, e: StoreError) {
        self.calls.end(e);
        self.notify.notify_one();
    }
}

/// Writes what a non-blocking socket takes now (0 if it is full).
fn write_now(mut sock: &std::net::TcpStream, mut frame: &[u8]) -> io::Result<usize> {
    let len = frame.len();
    while !frame.is_empty() {
        match sock.write(frame) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => frame = &frame[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(len - frame.len())
}

/// The future of one request's reply.
///
/// # Cancel safety
///
/// Dropping it forgets the request (a reply that comes later is ignored);
/// the request itself may already have been sent.
pub(crate) struct Call<'a> {
    shared: &'a Shared,
    id: u64,
    /// Until when this future reads the socket itself (`None`: it leaves
    /// the reply to the driver).
    read_until: Option<Instant>,
    done: bool,
}

impl<'a> Call<'a> {
    /// The future of request `id`; `alone`: what
    /// [`submit`](Shared::submit) returned (it may read its own reply, if
    /// no other request of this process is in flight).
    pub(crate) fn new(shared: &'a Shared, id: u64, alone: bool) -> Self {
        let others = IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        let reads = alone && others == 0;
        Call {
            shared,
            id,
            read_until: reads.then(|| Instant::now() + OWN_READ_BUDGET),
            done: false,
        }
    }
}

impl Future for Call<'_> {
    type Output = Result<Reply, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let polled = match this.shared.calls.poll(this.id, cx) {
            Poll::Pending => match this.read_until {
                Some(until) if Instant::now() < until && IN_FLIGHT.load(Ordering::Relaxed) == 1 => {
                    this.shared.read_now();
                    match this.shared.calls.poll(this.id, cx) {
                        Poll::Pending => {
                            // Let the server's thread run if it waits for
                            // this core, then read again when polled next.
                            std::thread::yield_now();
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        ready => ready,
                    }
                }
                Some(_) => {
                    // The budget is spent, or others wait: park until the
                    // driver wakes us.
                    this.read_until = None;
                    return Poll::Pending;
                }
                None => return Poll::Pending,
            },
            ready => ready,
        };
        this.done = true;
        match polled {
            Poll::Ready(Some(r)) => Poll::Ready(r),
            _ => Poll::Ready(Err(StoreError::Protocol(format!(
                "request {} polled after its reply was taken",
                this.id
            )))),
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            self.shared.calls.cancel(self.id);
        }
    }
}

/// Gives each reply to its request (outside the byte lock, so that a
/// caller woken by it does not wait for that lock to submit its next one).
fn complete(calls: &Calls<Reply, StoreError>, replies: Vec<(u64, Reply)>) {
    for (id, reply) in replies {
        calls.complete(id, Ok(reply));
    }
}

/// Takes every complete reply out of the read buffer, into `replies`.
fn parse(inb: &mut InBuf, replies: &mut Vec<(u64, Reply)>) -> Result<(), StoreError> {
    let mut pos = 0;
    let result = loop {
        let data = &inb.data()[pos..];
        match wire::check_frame(data, wire::MAX_FRAME_LEN) {
            Err(e) => break Err(e),
            Ok(FrameStatus::Partial) => break Ok(()),
            Ok(FrameStatus::Complete { total }) => {
                let (kind, id, body) = wire::split_frame(&data[..total]);
                pos += total;
                let reply = match Reply::decode(kind, body) {
                    Ok(r) => r,
                    Err(e) => break Err(e),
                };
                if id == 0 {
                    // An error about the connection itself.
                    break Err(match reply {
                        Reply::Error(e) => e.into_store_error(Duration::ZERO),
                        r => unexpected(r),
                    });
                }
                replies.push((id, reply));
            }
        }
    };
    inb.consume(pos);
    result
}

/// A connection error at `addr`.
pub(crate) fn conn_err(addr: &str, cause: impl std::fmt::Display) -> StoreError {
    StoreError::Connection {
        addr: addr.to_owned(),
        cause: cause.to_string(),
    }
}

/// The error for a reply of the wrong kind.
pub(crate) fn unexpected(r: Reply) -> StoreError {
    StoreError::Protocol(format!("unexpected reply {r:?}"))
}

/// Errors of the driver's read path.
enum ReadErr {
    Io(io::Error),
    Store(StoreError),
}

impl From<io::Error> for ReadErr {
    fn from(e: io::Error) -> Self {
        ReadErr::Io(e)
    }
}

/// The driver: flushes requests the caller could not write, reads replies
/// nobody else read, and fails requests on connection loss or when overdue.
/// Ends when the connection fails, or when every [`TcpStore`](crate::TcpStore)
/// handle is gone and its requests are written.
pub(crate) async fn drive(stream: TcpStream, shared: Arc<Shared>) {
    let s = &*shared;
    let overdue = || {
        conn_err(
            &s.addr,
            "no reply from the server in time (request_timeout past the operation's own timeout)",
        )
    };
    let end: StoreError = loop {
        if let Some(e) = s.calls.ended() {
            break e;
        }
        let must_write = {
            let mut w = lock(&s.wire);
            if let Err(e) = w.out.flush(&stream) {
                break conn_err(&s.addr, format!("write failed: {e}"));
            }
            let must_write = w.out.pending() > 0;
            if w.closed && !must_write {
                break conn_err(&s.addr, "store client dropped");
            }
            must_write
        };
        let next = s.calls.expire(Instant::now(), s.lead, overdue);
        tokio::select! {
            () = s.notify.notified() => {}
            r = stream.readable() => {
                if let Err(e) = r {
                    break conn_err(&s.addr, format!("read failed: {e}"));
                }
                let mut replies = Vec::new();
                let mut w = lock(&s.wire);
                let r = w.inbuf.read_ready(&stream, 16, |inb| parse(inb, &mut replies).map_err(ReadErr::Store));
                drop(w);
                complete(&s.calls, replies);
                match r {
                    Ok(false) => {}
                    Ok(true) => break conn_err(&s.addr, "server closed the connection"),
                    Err(ReadErr::Io(e)) => break conn_err(&s.addr, format!("read failed: {e}")),
                    Err(ReadErr::Store(e)) => break e,
                }
            }
            r = stream.writable(), if must_write => if let Err(e) = r {
                break conn_err(&s.addr, format!("write failed: {e}"));
            },
            () = tokio::time::sleep_until(next.into()) => {}
        }
    };
    s.calls.end(end);
}
