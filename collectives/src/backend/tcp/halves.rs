//! The two halves of a connection: readable and writable from any thread
//! without chorus's I/O thread, and registered with its I/O driver only
//! while a task waits on them there, for what it waits on.
//!
//! * **Any thread.** tokio reads or writes a socket only once its I/O
//!   driver reported it ready: a caller polling the worker or a reader
//!   (see `drive`) while the I/O thread sleeps would find a frame that
//!   arrived unread until that thread woke up. So each half first tries a
//!   plain non-blocking `recv` or `send` on the connection's descriptor
//!   (a read half that the host task waits on through the driver reads
//!   when the driver says so, as a tokio stream does),
//!   and waits on the driver's readiness only when that would block (a
//!   readiness the plain call made stale is cleared by the call made
//!   through it, so the next edge wakes the waiter; new bytes or new room
//!   always raise a new edge, so nothing is lost).
//! * **For what it waits on.** tokio's own streams register a socket for
//!   reading and writing at once. Then every frame the peer reads gives
//!   the sender's Unix socket room again: an edge that wakes the sender's
//!   I/O thread for nothing, once per frame. Here the read half registers
//!   for reading only, and the write half for writing only, and only
//!   while a write would block (through a duplicate of the descriptor,
//!   closed again once a write goes through: a driver takes a descriptor
//!   once). In steady state a connection holds one descriptor, as a tokio
//!   stream does.
//! * **Only while waited on there.** Every frame that arrives at a
//!   registered socket wakes the I/O thread, even when a spinning caller
//!   reads the frame itself: on a small VM that wake-up takes a core from
//!   the two spinning ranks. So a read half polled by a spinning caller
//!   ([`while_spinning`]) that finds nothing takes its socket out of the
//!   driver and returns pending without a waker (the caller polls again);
//!   the caller's last poll, not spinning, puts it back (a socket that
//!   became readable meanwhile is reported at once) and registers the
//!   waker, so the host task takes over with nothing missed.
//!
//! Dropping the write half shuts the connection's sending side down (the
//! peer reads the end), as tokio's owned write halves do.

use std::cell::Cell;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

thread_local! {
    /// This thread is a caller spinning on a small op (see `drive`).
    static SPINNING: Cell<bool> = const { Cell::new(false) };
    /// This thread is a caller whose small op is done, polling the readers
    /// one last time: pipes stay watched (see `drive`).
    static LINGERING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's `flag` set, restoring it after.
fn with_flag<R>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> R) -> R {
    struct Reset(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            self.0.with(|s| s.set(self.1));
        }
    }
    let _reset = Reset(flag, flag.with(|s| s.replace(true)));
    f()
}

/// Runs `f` as a spinning caller: read halves that find nothing leave the
/// I/O driver instead of registering a waker (see the module docs).
pub(super) fn while_spinning<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&SPINNING, f)
}

/// Whether this thread is a caller spinning on a small op.
pub(super) fn spinning() -> bool {
    SPINNING.with(Cell::get)
}

/// Runs `f` as a caller whose op is done and whose worker is idle: a pipe
/// that finds nothing stays watched, its writer does not ring (see
/// `drive`); sockets register with the I/O driver as usual.
pub(super) fn while_lingering<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&LINGERING, f)
}

/// Whether this thread is a caller lingering after its small op.
pub(super) fn lingering() -> bool {
    LINGERING.with(Cell::get)
}

/// A connected socket, non-blocking (tokio made it so; the flag belongs
/// to the socket, so every descriptor of it is non-blocking).
#[derive(Debug)]
pub(super) enum Sock {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// Retries `f` while it is interrupted by a signal.
fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

fn would_block<T>(r: &io::Result<T>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl Sock {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        retry(|| match self {
            Sock::Tcp(s) => (&*s).read(buf),
            Sock::Unix(s) => (&*s).read(buf),
        })
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        retry(|| match self {
            Sock::Tcp(s) => (&*s).write(buf),
            Sock::Unix(s) => (&*s).write(buf),
        })
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        retry(|| match self {
            Sock::Tcp(s) => (&*s).write_vectored(bufs),
            Sock::Unix(s) => (&*s).write_vectored(bufs),
        })
    }

    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }

    fn shutdown_write(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Write),
            Sock::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }

    /// The connection's two halves, sharing its one descriptor.
    pub(super) fn split(self) -> (ReadHalf, WriteHalf) {
        let sock = Arc::new(self);
        (
            ReadHalf {
                wait: Wait::new(sock.clone(), Interest::READABLE),
            },
            WriteHalf {
                wait: Wait::new(sock, Interest::WRITABLE),
            },
        )
    }
}

/// A half's socket, and its registration with the I/O driver (for the
/// half's one interest) while the half waits there. Plain calls go
/// through the socket either way.
#[derive(Debug)]
struct Wait {
    interest: Interest,
    sock: Arc<Sock>,
    /// The read half's own descriptor, or, for the write half, a duplicate
    /// made for the wait (the read half may be registered with the same
    /// driver, which takes a descriptor once).
    fd: Option<AsyncFd<Registrable>>,
}

/// What a half registers: the shared socket itself (read half), or a
/// duplicate of its descriptor (write half).
#[derive(Debug)]
enum Registrable {
    Shared(Arc<Sock>),
    Dup(Sock),
}

impl AsRawFd for Registrable {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Registrable::Shared(s) => s.as_raw_fd(),
            Registrable::Dup(s) => s.as_raw_fd(),
        }
    }
}

/// Registers `sock` for `interest` with the I/O driver of the runtime this
/// is called in (its duplicate, for writing).
fn register(sock: &Arc<Sock>, interest: Interest) -> io::Result<AsyncFd<Registrable>> {
    let what = if interest.is_readable() {
        Registrable::Shared(sock.clone())
    } else {
        Registrable::Dup(sock.try_clone()?)
    };
    // tokio's safe constructor, deprecated because it cannot know that the
    // descriptor stays open and the same while registered. Here it does:
    // the `AsyncFd` owns an `Arc` of the `Sock` (or a `Sock` of its own),
    // which owns the descriptor and neither closes nor swaps it until the
    // registration is dropped.
    #[allow(deprecated)]
    AsyncFd::with_interest(what, interest)
}

impl Wait {
    fn new(sock: Arc<Sock>, interest: Interest) -> Wait {
        Wait {
            interest,
            sock,
            fd: None,
        }
    }

    fn is_registered(&self) -> bool {
        self.fd.is_some()
    }

    /// Takes the half out of the I/O driver, if it is in (a duplicate made
    /// for the wait is closed).
    fn leave(&mut self) {
        self.fd = None;
    }

    /// Waits until the driver says the socket is ready (registering it
    /// first if it is out), then runs `f` on it; a readiness that `f`
    /// finds stale (it would block) is cleared and waited for again.
    fn poll_io<R>(
        &mut self,
        cx: &mut Context<'_>,
        mut f: impl FnMut(&Sock) -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        let fd = match &mut self.fd {
            Some(fd) => &*fd,
            slot => &*slot.insert(register(&self.sock, self.interest)?),
        };
        let sock = &self.sock;
        loop {
            let mut ready = if self.interest.is_readable() {
                ready!(fd.poll_read_ready(cx))?
            } else {
                ready!(fd.poll_write_ready(cx))?
            };
            if let Ok(r) = ready.try_io(|_| f(sock)) {
                return Poll::Ready(r);
            }
        }
    }
}

/// The read half of a connection (see the module docs).
#[derive(Debug)]
pub(super) struct ReadHalf {
    wait: Wait,
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Registered and waited on by the host task, the driver's
        // readiness says when to read (as in a tokio stream: no read that
        // is sure to find nothing); out of the driver, or spinning, read
        // first.
        let spin = spinning();
        if !spin && this.wait.is_registered() {
            let n = ready!(this.wait.poll_io(cx, |s| s.read(buf.initialize_unfilled())))?;
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        let r = this.wait.sock.read(buf.initialize_unfilled());
        let n = if !would_block(&r) {
            r?
        } else if spin {
            // The spinning caller polls again, and registers at its last
            // poll (see the module docs).
            this.wait.leave();
            return Poll::Pending;
        } else {
            ready!(this.wait.poll_io(cx, |s| s.read(buf.initialize_unfilled())))?
        };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// The write half of a connection (see the module docs).
#[derive(Debug)]
pub(super) struct WriteHalf {
    /// Registered for room (through a duplicate) while a write would
    /// block.
    wait: Wait,
}

impl WriteHalf {
    /// Writes with `f`; when the socket is full, waits for room through
    /// the driver, and stops hearing about room once a write went through.
    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        f: impl Fn(&Sock) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let r = f(&self.wait.sock);
        let n = if would_block(&r) {
            ready!(self.wait.poll_io(cx, &f))?
        } else {
            r?
        };
        self.wait.leave();
        Poll::Ready(Ok(n))
    }
}

impl WriteHalf {
    /// Rings the peer's doorbell: one byte, written at once or not at all
    /// (a full socket holds doorbells the peer has not read yet, which
    /// wake it as well; a broken one ends the peer's reads anyway).
    pub(super) fn ring(&self) {
        let _ = self.wait.sock.write(&[1]);
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_with(cx, |s| s.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_with(cx, |s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.wait.sock.shutdown_write();
        Poll::Ready(Ok(()))
    }
}

impl Drop for WriteHalf {
    fn drop(&mut self) {
        self.wait.sock.shutdown_write();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};
    use std::time::{Duration, Instant};

    use super::*;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn woken_within(count: &Count, d: Duration) -> bool {
        let t = Instant::now();
        while count.0.load(Ordering::SeqCst) == 0 && t.elapsed() < d {
            std::thread::sleep(Duration::from_millis(1));
        }
        count.0.load(Ordering::SeqCst) > 0
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_io()
            .build()
            .expect("a runtime")
    }

    /// One poll of `rd` for up to 4 bytes, spinning or not: the bytes read,
    /// or `None` while pending.
    fn read4(rd: &mut ReadHalf, cx: &mut Context<'_>, spin: bool) -> Option<Vec<u8>> {
        let mut buf = [0u8; 4];
        let mut rb = ReadBuf::new(&mut buf);
        let mut poll = || Pin::new(&mut *rd).poll_read(cx, &mut rb);
        let r = if spin { while_spinning(poll) } else { poll() };
        match r {
            Poll::Ready(Ok(())) => Some(rb.filled().to_vec()),
            Poll::Ready(Err(e)) => panic!("read failed: {e}"),
            Poll::Pending => None,
        }
    }

    fn pair() -> (Sock, UnixStream) {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        a.set_nonblocking(true).expect("non-blocking");
        (Sock::Unix(a), b)
    }

    /// A spinning caller's poll that finds nothing takes the socket out of
    /// the driver and registers no waker; the next poll, not spinning,
    /// puts it back with its waker, which a frame then wakes; the frame is
    /// read whole.
    #[test]
    fn a_read_half_leaves_the_driver_while_spinning_and_hears_the_next_frame_after() {
        let rt = runtime();
        let _rt = rt.enter();
        let (a, mut b) = pair();
        let (mut rd, _wr) = a.split();
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(read4(&mut rd, &mut cx, true), None);
        assert!(!rd.wait.is_registered(), "still registered");

        assert_eq!(read4(&mut rd, &mut cx, false), None);
        assert!(rd.wait.is_registered(), "not registered");

        b.write_all(b"ping").expect("write");
        assert!(
            woken_within(&count, Duration::from_secs(5)),
            "the frame woke nobody"
        );
        assert_eq!(
            read4(&mut rd, &mut cx, false).as_deref(),
            Some(&b"ping"[..])
        );
    }

    /// A frame that arrives while the socket is out of the driver is read
    /// by the next poll, spinning or not.
    #[test]
    fn a_frame_that_arrived_out_of_the_driver_is_read_at_once() {
        let rt = runtime();
        let _rt = rt.enter();
        let (a, mut b) = pair();
        let (mut rd, _wr) = a.split();
        let waker = Waker::from(Arc::new(Count::default()));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(read4(&mut rd, &mut cx, true), None);
        b.write_all(b"pong").expect("write");
        assert_eq!(
            read4(&mut rd, &mut cx, false).as_deref(),
            Some(&b"pong"[..])
        );
    }

    /// Descriptors this process has open on the socket `fd` is open on (its
    /// duplicates: other tests' descriptors, opened meanwhile on threads of
    /// their own, do not count).
    fn open_fds_on(fd: std::os::fd::RawFd) -> usize {
        let of = |p: std::path::PathBuf| std::fs::read_link(p).ok();
        let Some(target) = of(format!("/proc/self/fd/{fd}").into()) else {
            return 0;
        };
        std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
            d.flatten()
                .filter(|e| of(e.path()).as_ref() == Some(&target))
                .count()
        })
    }

    /// A write half registers for room only while its socket is full: a
    /// full socket's write is pending and registered (through one more
    /// descriptor), the peer's read wakes it, and the write that then goes
    /// through leaves the driver and closes that descriptor again; the two
    /// halves share the connection's one descriptor.
    #[test]
    fn a_write_half_waits_for_room_only_while_full() {
        let rt = runtime();
        let _rt = rt.enter();
        let (a, mut b) = pair();
        let fd = a.as_raw_fd();
        let open_fds = || open_fds_on(fd);
        let before = open_fds();
        assert_eq!(before, 1);
        let (_rd, mut wr) = a.split();
        assert_eq!(open_fds(), before, "splitting opened descriptors");
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let chunk = [7u8; 4096];
        let mut sent = 0usize;
        let blocked = loop {
            match Pin::new(&mut wr).poll_write(&mut cx, &chunk) {
                Poll::Ready(Ok(n)) => {
                    sent += n;
                    assert!(!wr.wait.is_registered());
                }
                Poll::Ready(Err(e)) => panic!("write failed: {e}"),
                Poll::Pending => break true,
            }
            assert!(sent < 64 << 20, "the socket never filled");
        };
        assert!(blocked);
        assert!(wr.wait.is_registered(), "not registered");
        assert_eq!(open_fds(), before + 1, "a blocked write holds one more");
        let mut sink = vec![0u8; sent];
        std::io::Read::read_exact(&mut b, &mut sink).expect("drain");
        assert!(
            woken_within(&count, Duration::from_secs(5)),
            "room woke nobody"
        );
        match Pin::new(&mut wr).poll_write(&mut cx, &chunk) {
            Poll::Ready(Ok(n)) => assert!(n > 0),
            other => panic!("expected room, got {other:?}"),
        }
        assert!(!wr.wait.is_registered(), "still registered");
        assert_eq!(open_fds(), before, "the wait's descriptor stayed open");
    }
}
