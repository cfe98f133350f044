//! A connection's byte stream through a shared-memory pipe: between two
//! ranks of one host whose segments are mapped (see `shm`), the frames go
//! through the pipe in the sender's segment instead of the socket, and the
//! socket is left the control plane: a byte on it is a doorbell (the
//! reader sleeps and the writer published bytes), and its end is the
//! peer's end.
//!
//! While both ranks run, a frame costs no system call: the writer copies
//! it into the ring and publishes it, the reader (a caller spinning on its
//! op, or the reader task) copies it out. A reader that finds nothing and
//! does not spin says it sleeps and waits on the socket; the writer's next
//! publish sees that and rings (one byte, non-blocking: a doorbell still
//! unread is as good). A reader that a caller left watched after its op
//! (see `linger`) is not rung. A writer that finds the ring full rings
//! once (the reader may be lingering) and backs off on a short timer: the
//! reader task, woken, drains the ring into its queues whatever its worker
//! does, so the ring stays full only while that task is not running.
//!
//! [`Source`] and [`Sink`] are a connection's read and write sides, over
//! the socket or a pipe: the frame code above them is the same for both.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chorus_core::pipe::Wake;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::halves::{lingering, spinning, ReadHalf, WriteHalf};
use super::shm::{PipeRx, PipeTx};

/// The read side of a connection: the socket, or the peer's pipe with the
/// socket for its doorbells and its end.
#[derive(Debug)]
pub(super) enum Source {
    Socket(ReadHalf),
    Pipe(PipeRead),
}

/// The write side of a connection: the socket, or this rank's pipe with
/// the socket for doorbells.
#[derive(Debug)]
pub(super) enum Sink {
    Socket(WriteHalf),
    Pipe(PipeWrite),
}

/// Reads the peer's pipe (see the module docs).
#[derive(Debug)]
pub(super) struct PipeRead {
    pipe: PipeRx,
    sock: ReadHalf,
    /// The socket ended: what is left in the pipe is all there is.
    ended: bool,
}

impl PipeRead {
    pub(super) fn new(pipe: PipeRx, sock: ReadHalf) -> PipeRead {
        PipeRead {
            pipe,
            sock,
            ended: false,
        }
    }
}

impl AsyncRead for PipeRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let n = this.pipe.read(buf.initialize_unfilled());
            if n > 0 {
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                // The end of the stream, after everything the peer wrote.
                return Poll::Ready(Ok(()));
            }
            if spinning() {
                // The spinning caller polls again (the writer need not
                // ring meanwhile); its last poll, not spinning, says it
                // sleeps.
                this.pipe.watch();
                return Poll::Pending;
            }
            if lingering() {
                // A caller whose op is done: the pipe stays watched, so
                // the writer does not ring for the next op's frames; the
                // socket still wakes this reader's host for its end and
                // for a full ring's doorbell (see `drive`).
                this.pipe.watch();
            } else if !this.pipe.sleep() {
                continue;
            }
            let mut bells = [0u8; 64];
            let mut rb = ReadBuf::new(&mut bells);
            match Pin::new(&mut this.sock).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => this.ended = true,
                // Doorbells: look at the pipe again.
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Writes this rank's pipe (see the module docs).
#[derive(Debug)]
pub(super) struct PipeWrite {
    pipe: PipeTx,
    sock: WriteHalf,
    /// Doorbells this rank rang, over all its pipes.
    rung: Arc<AtomicU64>,
    /// The back-off while the ring is full.
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Its next length.
    pause: Duration,
}

/// The first back-off of a writer that finds the ring full, doubled up to
/// [`MAX_PAUSE`] while it stays full.
const FIRST_PAUSE: Duration = Duration::from_micros(20);
const MAX_PAUSE: Duration = Duration::from_millis(1);

impl PipeWrite {
    pub(super) fn new(pipe: PipeTx, sock: WriteHalf, rung: Arc<AtomicU64>) -> PipeWrite {
        PipeWrite {
            pipe,
            sock,
            rung,
            backoff: None,
            pause: FIRST_PAUSE,
        }
    }
}

impl PipeWrite {
    fn ring(&self) {
        self.rung.fetch_add(1, Ordering::Relaxed);
        self.sock.ring();
    }
}

impl AsyncWrite for PipeWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.backoff.as_mut() {
                if b.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.backoff = None;
            }
            let (n, wake) = this.pipe.write(buf);
            if wake == Wake::Peer {
                this.ring();
            }
            if n > 0 || buf.is_empty() {
                this.pause = FIRST_PAUSE;
                return Poll::Ready(Ok(n));
            }
            // Full: wait a little for the reader task to drain it, and ring
            // at the first look (a lingering reader does not drain).
            if this.pause == FIRST_PAUSE {
                this.ring();
            }
            this.backoff = Some(Box::pin(tokio::time::sleep(this.pause)));
            this.pause = (this.pause * 2).min(MAX_PAUSE);
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().sock).poll_shutdown(cx)
    }
}

impl AsyncRead for Source {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Source::Socket(s) => Pin::new(s).poll_read(cx, buf),
            Source::Pipe(p) => Pin::new(p).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Sink {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Sink::Socket(s) => Pin::new(s).poll_write(cx, buf),
            Sink::Pipe(p) => Pin::new(p).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Sink::Socket(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Sink::Pipe(p) => {
                let first = bufs
                    .iter()
                    .find(|b| !b.is_empty())
                    .map_or(&[][..], |b| &b[..]);
                Pin::new(p).poll_write(cx, first)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        matches!(self, Sink::Socket(_))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sink::Socket(s) => Pin::new(s).poll_flush(cx),
            Sink::Pipe(p) => Pin::new(p).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sink::Socket(s) => Pin::new(s).poll_shutdown(cx),
            Sink::Pipe(p) => Pin::new(p).poll_shutdown(cx),
        }
    }
}
