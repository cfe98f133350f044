//! The TCP store server.
//!
//! **Bind it only to the cluster's private network.** The protocol has no
//! encryption: keys, values and the optional token cross the network in
//! clear text, and anyone who can reach the port and knows the token (or
//! any peer at all, without a token) can read and write every key.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use std::sync::Arc;

use crate::error::StoreError;
use crate::io::{InBuf, OutBuf, OUT_HIGH_WATER};
use crate::memory::{take_all, take_present, InMemoryStore, Kv};
use crate::server_stats::{Counters, ServerStats};
use crate::wire::{self, status, Encoder, FrameStatus, Request};

/// Most waiting operations (get, wait, multi_get whose keys are missing)
/// one connection may have in flight; more get an error reply.
const MAX_WAITS_PER_CONN: usize = 16_384;

/// After answering, how long a connection keeps reading its socket itself
/// (yielding to the runtime between reads) before it waits for readiness.
/// A client with one request in flight sends its next one as soon as it
/// has read the reply; found within this window, it costs no wake-up of
/// the server's thread, which would otherwise have gone to sleep in
/// `epoll_wait` in between (the wake-up is most of a loopback round trip).
const SERVE_WATCH: Duration = Duration::from_micros(30);
/// Options of [`TcpStoreServer::bind`].
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Shared token. When set, a connection's first frame must be the
    /// hello frame carrying this token, or it is refused before any key is
    /// read or written.
    pub token: Option<String>,
    /// Most client connections at once; more are refused (default 16,384).
    /// Each needs a file descriptor: raise `RLIMIT_NOFILE` to match.
    pub max_connections: usize,
    /// Time a client has to finish a frame it started (default 30 s);
    /// one that stalls mid-frame longer gets an error and is disconnected.
    /// When a token is set, also the time a new connection has to send its
    /// hello.
    pub frame_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            token: None,
            max_connections: 16_384,
            frame_timeout: Duration::from_secs(30),
        }
    }
}

impl ServerOptions {
    /// Defaults, with the token read from `CHORUS_STORE_TOKEN` (unset or
    /// empty: no token).
    pub fn from_env() -> Self {
        ServerOptions {
            token: crate::config::token(),
            ..Self::default()
        }
    }
}

/// State shared by the server's tasks.
#[derive(Debug)]
struct Shared {
    kv: Arc<Kv>,
    opts: ServerOptions,
    /// A connection is watching its socket after an answer (one at a
    /// time: with several clients busy the threads have work anyway).
    watching: std::sync::atomic::AtomicBool,
    /// Which connection answered last, and when (µs since `epoch`): a
    /// connection watches only when no other answered just before it.
    last_answer: std::sync::atomic::AtomicU64,
    epoch: Instant,
    next_conn: std::sync::atomic::AtomicU64,
    /// What the connections served.
    counters: Arc<Counters>,
}

/// Another connection's answer less than this long before one's own says
/// several clients are busy: no watch then.
const OTHERS_BUSY: Duration = Duration::from_micros(500);

impl Shared {
    /// Notes that connection `conn` answered now; false if another one
    /// answered less than [`OTHERS_BUSY`] before.
    fn answered_alone(&self, conn: u64) -> bool {
        self.answered_alone_at(conn, self.epoch.elapsed().as_micros() as u64)
    }

    /// [`answered_alone`](Self::answered_alone) at `us` µs after `epoch`.
    fn answered_alone_at(&self, conn: u64, us: u64) -> bool {
        use std::sync::atomic::Ordering;
        const LOW: u64 = (1 << 40) - 1;
        let us = us & LOW;
        let prev = self.last_answer.swap((conn << 40) | us, Ordering::Relaxed);
        let (who, at) = (prev >> 40, prev & LOW);
        who == conn || us.wrapping_sub(at) & LOW >= OTHERS_BUSY.as_micros() as u64
    }
}

/// The store server: serves one key-value table to many [`TcpStore`]
/// clients.
///
/// Its tasks run on chorus's background runtime. It stops, closing every
/// connection, on [`shutdown`](Self::shutdown) or when dropped.
///
/// **Security:** bind it only to the cluster's private network (the
/// address rank 0 uses for `MASTER_ADDR`), never to a public interface.
/// There is no encryption; the optional token ([`ServerOptions::token`],
/// `CHORUS_STORE_TOKEN`) only keeps out peers that do not know it.
///
/// [`TcpStore`]: crate::TcpStore
#[derive(Debug)]
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    store: InMemoryStore,
    /// Dropping it tells every task to stop.
    stop: Option<watch::Sender<()>>,
    task: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

fn io_err(addr: SocketAddr, e: &std::io::Error) -> StoreError {
    StoreError::Connection {
        addr: addr.to_string(),
        cause: e.to_string(),
    }
}

impl TcpStoreServer {
    /// Binds to `addr` (port 0 picks a free port) and starts serving.
    ///
    /// Callable from any executor, inside a tokio runtime or not.
    ///
    /// # Errors
    ///
    /// [`StoreError::Connection`] if the address cannot be bound (in use,
    /// not local), [`StoreError::Runtime`] if chorus's I/O threads cannot
    /// start.
    pub async fn bind(addr: SocketAddr, opts: ServerOptions) -> Result<TcpStoreServer, StoreError> {
        if let Some(t) = &opts.token {
            if t.len() > wire::MAX_TOKEN_LEN {
                return Err(StoreError::TooLarge {
                    what: "token",
                    len: t.len(),
                    limit: wire::MAX_TOKEN_LEN,
                });
            }
        }
        let handle = crate::rt::handle().map_err(StoreError::Runtime)?;
        let listener = {
            let _guard = handle.enter();
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }
            .map_err(|e| io_err(addr, &e))?;
            socket.set_reuseaddr(true).map_err(|e| io_err(addr, &e))?;
            socket.bind(addr).map_err(|e| io_err(addr, &e))?;
            socket.listen(4096).map_err(|e| io_err(addr, &e))?
        };
        let local_addr = listener.local_addr().map_err(|e| io_err(addr, &e))?;
        let store = InMemoryStore::new();
        let counters = Arc::new(Counters::default());
        let shared = Arc::new(Shared {
            kv: Arc::clone(store.kv()),
            opts,
            watching: std::sync::atomic::AtomicBool::new(false),
            last_answer: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            counters: Arc::clone(&counters),
        });
        let (stop, stop_rx) = watch::channel(());
        let task = handle.spawn(accept_loop(listener, shared, stop_rx));
        tracing::debug!(%local_addr, "store server listening");
        Ok(TcpStoreServer {
            local_addr,
            store,
            stop: Some(stop),
            task: Some(task),
            counters,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the server has served since it started: connections, requests,
    /// bytes and the time spent answering. Cheap (a few atomic loads).
    pub fn stats(&self) -> ServerStats {
        self.counters.snapshot()
    }

    /// A handle to the served table, for use inside this process without
    /// going through TCP.
    pub fn local_store(&self) -> InMemoryStore {
        self.store.clone()
    }

    /// Stops accepting, closes every connection and waits until all of the
    /// server's tasks have ended. Clients waiting on keys get a connection
    /// error.
    pub async fn shutdown(mut self) {
        self.stop.take();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => match r {
                Ok((sock, peer)) => {
                    if conns.len() >= shared.opts.max_connections {
                        tracing::warn!(%peer, limit = shared.opts.max_connections, "store server: connection refused, at the limit");
                        refuse(sock, "too many connections");
                        continue;
                    }
                    let _ = sock.set_nodelay(true);
                    shared.counters.connected();
                    conns.spawn(serve(sock, peer, Arc::clone(&shared), stop.clone()));
                }
                Err(e) => {
                    // Out of descriptors or memory: let other tasks free some.
                    tracing::warn!(error = %e, "store server: accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// Sends an error frame without waiting (a new socket's send buffer is
/// empty), then closes the connection.
fn refuse(sock: TcpStream, msg: &str) {
    let mut buf = Vec::new();
    wire::encode_error(&mut buf, 0, &StoreError::Protocol(msg.to_owned()));
    // Tokio has not seen the socket writable yet: write through std.
    if let Ok(std) = sock.into_std() {
        let _ = std::io::Write::write(&mut &std, &buf);
    }
}

/// Compares two byte strings in time that depends only on their lengths.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// A waiting operation's result.
enum Outcome {
    Ok,
    Value(Vec<u8>),
    Values(Vec<Vec<u8>>),
}

type WaitFuture = Pin<Box<dyn Future<Output = (u64, Result<Outcome, StoreError>)> + Send>>;

/// Why a connection ends.
enum End {
    /// Bad input: send this error (for request `id`), then close.
    Fatal(u64, StoreError),
}

struct Conn {
    /// This connection among the server's (see `Shared::answered_alone`).
    id: u64,
    shared: Arc<Shared>,
    peer: SocketAddr,
    authed: bool,
    inbuf: InBuf,
    out: OutBuf,
    waits: FuturesUnordered<WaitFuture>,
}

async fn serve(sock: TcpStream, peer: SocketAddr, shared: Arc<Shared>, stop: watch::Receiver<()>) {
    let authed = shared.opts.token.is_none();
    // Ids fit the 24 bits `Shared::last_answer` keeps of them (they wrap).
    let id = shared
        .next_conn
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        & ((1 << 24) - 1);
    let mut conn = Conn {
        id,
        shared,
        peer,
        authed,
        inbuf: InBuf::default(),
        out: OutBuf::default(),
        waits: FuturesUnordered::new(),
    };
    // The same open socket (non-blocking like tokio's), read during the
    // watch after each answer without tokio's readiness.
    let raw = match sock.as_fd().try_clone_to_owned() {
        Ok(fd) => Some(std::net::TcpStream::from(fd)),
        Err(e) => {
            tracing::debug!(peer = %peer, error = %e, "store server: no second handle on the socket; no watch after answers");
            None
        }
    };
    if let Err(End::Fatal(id, e)) = conn.run(&sock, raw.as_ref(), stop).await {
        tracing::warn!(peer = %conn.peer, error = %e, "store server: dropping client");
        wire::encode_error(conn.out.buf(), id, &e);
        // Best effort, bounded: the client may not be reading.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match conn.out.flush(&sock) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => {
                        if sock.writable().await.is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .await;
    }
}

impl Conn {
    async fn run(
        &mut self,
        sock: &TcpStream,
        raw: Option<&std::net::TcpStream>,
        mut stop: watch::Receiver<()>,
    ) -> Result<(), End> {
        let started = Instant::now();
        let mut partial_since: Option<Instant> = None;
        let mut progressed = false;
        // Frames answered by the last read: one is a client with one
        // request in flight, which the watch is for (a pipelining client
        // keeps the connection busy by itself).
        let mut answered = 0usize;
        loop {
            // Send replies.
            if self.out.pending() > 0 {
                if let Err(e) = self.out.flush(sock) {
                    tracing::debug!(peer = %self.peer, error = %e, "store server: write failed");
                    return Ok(());
                }
            }
            // Everything asked so far is answered: watch for the next
            // request a little before waiting for readiness.
            // Every answer is noted (a pipelining connection keeps others
            // from watching too); only a lone one may be watched after.
            let alone = answered > 0 && self.shared.answered_alone(self.id);
            if let Some(raw) = raw.filter(|_| {
                alone
                    && answered == 1
                    && self.authed
                    && self.out.pending() == 0
                    && self.inbuf.is_empty()
                    && self.waits.is_empty()
            }) {
                answered = 0;
                match self.watch(raw, &mut progressed, &mut answered).await {
                    Ok(false) => {
                        if progressed {
                            continue;
                        }
                    }
                    Ok(true) => {
                        let _ = self.out.flush(sock);
                        return Ok(());
                    }
                    Err(ReadErr::Io(e)) => {
                        tracing::debug!(peer = %self.peer, error = %e, "store server: read failed");
                        return Ok(());
                    }
                    Err(ReadErr::End(end)) => return Err(end),
                }
            }
            // A frame must complete within frame_timeout of the first of its
            // bytes (of the connection, for the hello when a token is needed).
            if self.inbuf.is_empty() || progressed {
                partial_since = None;
            }
            if !self.inbuf.is_empty() && partial_since.is_none() {
                partial_since = Some(Instant::now());
            }
            progressed = false;
            let timeout = self.shared.opts.frame_timeout;
            let frame_deadline = if self.authed {
                partial_since.map(|t| t + timeout)
            } else {
                Some(started + timeout)
            };
            // Replies pile up: stop reading until the client reads.
            let can_read = self.out.pending() < OUT_HIGH_WATER;
            let must_write = self.out.pending() > 0;
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                r = sock.readable(), if can_read => {
                    if r.is_err() {
                        return Ok(());
                    }
                    let shared = &self.shared;
                    let authed = &mut self.authed;
                    let out = &mut self.out;
                    let waits = &mut self.waits;
                    let progress = &mut progressed;
                    answered = 0;
                    let frames = &mut answered;
                    let eof = match self.inbuf.read_ready(sock, 16, |inb| {
                        process(inb, shared, authed, out, waits, progress, frames)
                    }) {
                        Ok(eof) => eof,
                        Err(ReadErr::Io(e)) => {
                            tracing::debug!(peer = %self.peer, error = %e, "store server: read failed");
                            return Ok(());
                        }
                        Err(ReadErr::End(end)) => return Err(end),
                    };
                    if eof {
                        if !self.inbuf.is_empty() {
                            tracing::warn!(peer = %self.peer, bytes = self.inbuf.data().len(), "store server: client disconnected mid-frame");
                        }
                        let _ = self.out.flush(sock);
                        return Ok(());
                    }
                }
                r = sock.writable(), if must_write => {
                    if r.is_err() {
                        return Ok(());
                    }
                    if let Err(e) = self.out.flush(sock) {
                        tracing::debug!(peer = %self.peer, error = %e, "store server: write failed");
                        return Ok(());
                    }
                }
                Some((id, out)) = self.waits.next(), if !self.waits.is_empty() => {
                    let t = Instant::now();
                    let before = self.out.buf().len();
                    encode_outcome(self.out.buf(), id, out);
                    let bytes = self.out.buf().len().saturating_sub(before) as u64;
                    self.shared.counters.served(0, 0, bytes, t.elapsed());
                }
                _ = sleep_until_opt(frame_deadline), if frame_deadline.is_some() => {
                    if !self.authed {
                        return Err(End::Fatal(0, StoreError::Auth(format!(
                            "no hello with the token within {timeout:?}"
                        ))));
                    }
                    return Err(End::Fatal(0, StoreError::Protocol(format!(
                        "frame not completed within {timeout:?} ({} bytes received)",
                        self.inbuf.data().len()
                    ))));
                }
            }
        }
    }
}

impl Conn {
    /// Reads `raw` for up to [`SERVE_WATCH`], yielding between reads, and
    /// answers what arrives (`progressed` then set, `answered` counting
    /// the frames). True at EOF. Does nothing while another connection of
    /// the server watches.
    async fn watch(
        &mut self,
        raw: &std::net::TcpStream,
        progressed: &mut bool,
        answered: &mut usize,
    ) -> Result<bool, ReadErr> {
        *progressed = false;
        let shared = self.shared.clone();
        let Some(_turn) = WatchTurn::take(&shared.watching) else {
            return Ok(false);
        };
        let until = Instant::now() + SERVE_WATCH;
        loop {
            match self.inbuf.read_from(&mut &*raw) {
                Ok(0) => return Ok(true),
                Ok(_) => {
                    process(
                        &mut self.inbuf,
                        &self.shared,
                        &mut self.authed,
                        &mut self.out,
                        &mut self.waits,
                        progressed,
                        answered,
                    )?;
                    return Ok(false);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            tokio::task::yield_now().await;
        }
    }
}

/// The server's one watch, held by a connection until dropped (also when
/// the connection's task is cancelled mid-watch).
struct WatchTurn<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> WatchTurn<'a> {
    fn take(flag: &'a std::sync::atomic::AtomicBool) -> Option<Self> {
        let taken = flag.swap(true, std::sync::atomic::Ordering::Acquire);
        (!taken).then_some(WatchTurn(flag))
    }
}

impl Drop for WatchTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Errors of the read path.
enum ReadErr {
    Io(std::io::Error),
    End(End),
}

impl From<std::io::Error> for ReadErr {
    fn from(e: std::io::Error) -> Self {
        ReadErr::Io(e)
    }
}

fn encode_outcome(wbuf: &mut Vec<u8>, id: u64, out: Result<Outcome, StoreError>) {
    match out {
        Ok(Outcome::Ok) => ok(wbuf, id),
        Ok(Outcome::Value(v)) => {
            let mut e = Encoder::begin(wbuf, status::VALUE, id);
            e.bytes(&v);
            e.finish();
        }
        Ok(Outcome::Values(vs)) => encode_values(wbuf, id, vs.iter().map(Vec::as_slice)),
        Err(e) => wire::encode_error(wbuf, id, &e),
    }
}

/// Answers every complete frame at the front of the read buffer.
fn process(
    inb: &mut InBuf,
    shared: &Arc<Shared>,
    authed: &mut bool,
    out: &mut OutBuf,
    waits: &mut FuturesUnordered<WaitFuture>,
    progressed: &mut bool,
    frames: &mut usize,
) -> Result<(), ReadErr> {
    let mut pos = 0;
    let started = Instant::now();
    let out_before = out.buf().len();
    let frames_before = *frames;
    let result = loop {
        let max = if *authed {
            wire::MAX_FRAME_LEN
        } else {
            wire::MAX_HELLO_FRAME_LEN
        };
        let data = &inb.data()[pos..];
        match wire::check_frame(data, max) {
            Err(e) => break Err(End::Fatal(0, e)),
            Ok(FrameStatus::Partial) => break Ok(()),
            Ok(FrameStatus::Complete { total }) => {
                let (kind, id, body) = wire::split_frame(&data[..total]);
                let req = match Request::decode(kind, body) {
                    Ok(r) => r,
                    Err(e) => break Err(End::Fatal(id, e)),
                };
                if let Err(e) = handle(shared, authed, out.buf(), waits, id, req) {
                    break Err(e);
                }
                *frames += 1;
                pos += total;
            }
        }
    };
    if pos > 0 {
        *progressed = true;
        inb.consume(pos);
        shared.counters.served(
            frames.saturating_sub(frames_before) as u64,
            pos as u64,
            out.buf().len().saturating_sub(out_before) as u64,
            started.elapsed(),
        );
    }
    result.map_err(ReadErr::End)
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => futures::future::pending().await,
    }
}

/// Encodes a `VALUES` reply, or a `TooLarge` error if it would not fit in
/// a frame.
fn encode_values<'v>(
    wbuf: &mut Vec<u8>,
    id: u64,
    vs: impl ExactSizeIterator<Item = &'v [u8]> + Clone,
) {
    let len = wire::HEADER_LEN + 4 + vs.clone().map(|v| v.len() + 4).sum::<usize>();
    if len > wire::MAX_FRAME_LEN {
        wire::encode_error(
            wbuf,
            id,
            &StoreError::TooLarge {
                what: "frame",
                len,
                limit: wire::MAX_FRAME_LEN,
            },
        );
        return;
    }
    let mut e = Encoder::begin(wbuf, status::VALUES, id);
    e.count(vs.len());
    for v in vs {
        e.bytes(v);
    }
    e.finish();
}

fn ok(wbuf: &mut Vec<u8>, id: u64) {
    Encoder::begin(wbuf, status::OK, id).finish();
}

/// Answers one request; waiting ones whose keys are missing go to `waits`.
fn handle(
    shared: &Arc<Shared>,
    authed: &mut bool,
    wbuf: &mut Vec<u8>,
    waits: &mut FuturesUnordered<WaitFuture>,
    id: u64,
    req: Request<'_>,
) -> Result<(), End> {
    if !*authed && !matches!(req, Request::Hello { .. }) {
        return Err(End::Fatal(
            id,
            StoreError::Auth("this server needs a token: the first frame must be hello".to_owned()),
        ));
    }
    let kv = &shared.kv;
    match req {
        Request::Hello { token } => {
            if let Some(want) = &shared.opts.token {
                if !ct_eq(token, want.as_bytes()) {
                    return Err(End::Fatal(
                        id,
                        StoreError::Auth("wrong or missing token".to_owned()),
                    ));
                }
            }
            *authed = true;
            ok(wbuf, id);
        }
        Request::Set { key, value } => {
            kv.set(key, value.to_vec());
            ok(wbuf, id);
        }
        Request::Get { key, timeout } => {
            let found = kv.try_take(|m| {
                m.get(key).map(|v| {
                    let mut e = Encoder::begin(wbuf, status::VALUE, id);
                    e.bytes(v);
                    e.finish();
                })
            });
            if found.is_none() {
                let keys = vec![key.to_owned()];
                push_wait(shared, wbuf, waits, id, keys, timeout, |kv, keys, t| {
                    Box::pin(async move {
                        let k = [keys[0].as_str()];
                        let r = kv
                            .wait_for(&k, t, tokio::time::sleep(t), |m| m.get(k[0]).cloned())
                            .await;
                        (id, r.map(Outcome::Value))
                    })
                });
            }
        }
        Request::Add { key, delta } => match kv.add(key, delta) {
            Ok(v) => {
                let mut e = Encoder::begin(wbuf, status::INT, id);
                e.i64(v);
                e.finish();
            }
            Err(e) => wire::encode_error(wbuf, id, &e),
        },
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            let v = kv.compare_set(key, expected, desired);
            let mut e = Encoder::begin(wbuf, status::VALUE, id);
            e.bytes(&v);
            e.finish();
        }
        Request::Wait { keys, timeout } => {
            if kv.check(&keys) {
                ok(wbuf, id);
            } else {
                let keys = keys.iter().map(|k| (*k).to_owned()).collect();
                push_wait(shared, wbuf, waits, id, keys, timeout, |kv, keys, t| {
                    Box::pin(async move {
                        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
                        let r = kv
                            .wait_for(&k, t, tokio::time::sleep(t), take_present(&k))
                            .await;
                        (id, r.map(|()| Outcome::Ok))
                    })
                });
            }
        }
        Request::Check { keys } => {
            let mut e = Encoder::begin(wbuf, status::BOOL, id);
            e.u8(u8::from(kv.check(&keys)));
            e.finish();
        }
        Request::Present { keys } => {
            let flags: Vec<u8> = kv.present(&keys).into_iter().map(u8::from).collect();
            let mut e = Encoder::begin(wbuf, status::VALUE, id);
            e.bytes(&flags);
            e.finish();
        }
        Request::Delete { key } => {
            let mut e = Encoder::begin(wbuf, status::BOOL, id);
            e.u8(u8::from(kv.delete(key)));
            e.finish();
        }
        Request::NumKeys { prefix } => {
            let mut e = Encoder::begin(wbuf, status::COUNT, id);
            e.u64(kv.num_keys(prefix));
            e.finish();
        }
        Request::MultiGet { keys, timeout } => {
            let found = kv.try_take(|m| {
                let vs: Option<Vec<&Vec<u8>>> = keys.iter().map(|k| m.get(*k)).collect();
                vs.map(|vs| encode_values(wbuf, id, vs.into_iter().map(Vec::as_slice)))
            });
            if found.is_none() {
                let keys = keys.iter().map(|k| (*k).to_owned()).collect();
                push_wait(shared, wbuf, waits, id, keys, timeout, |kv, keys, t| {
                    Box::pin(async move {
                        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
                        let r = kv
                            .wait_for(&k, t, tokio::time::sleep(t), take_all(&k))
                            .await;
                        (id, r.map(Outcome::Values))
                    })
                });
            }
        }
        Request::MultiSet { entries } => {
            kv.multi_set(&entries);
            ok(wbuf, id);
        }
    }
    Ok(())
}

/// Queues a waiting operation, or answers with an error when the
/// connection has too many.
fn push_wait(
    shared: &Arc<Shared>,
    wbuf: &mut Vec<u8>,
    waits: &mut FuturesUnordered<WaitFuture>,
    id: u64,
    keys: Vec<String>,
    timeout: Duration,
    make: impl FnOnce(Arc<Kv>, Vec<String>, Duration) -> WaitFuture,
) {
    if waits.len() >= MAX_WAITS_PER_CONN {
        wire::encode_error(
            wbuf,
            id,
            &StoreError::Protocol(format!(
                "more than {MAX_WAITS_PER_CONN} waiting operations on one connection"
            )),
        );
        return;
    }
    waits.push(make(Arc::clone(&shared.kv), keys, timeout));
}

#[cfg(test)]
mod tests {
    use super::{ct_eq, Shared, WatchTurn, OTHERS_BUSY};

    #[test]
    fn one_watch_per_server_given_back_when_dropped() {
        let flag = std::sync::atomic::AtomicBool::new(false);
        let turn = WatchTurn::take(&flag).expect("free");
        assert!(WatchTurn::take(&flag).is_none(), "taken");
        drop(turn);
        assert!(WatchTurn::take(&flag).is_some(), "given back");
    }

    #[test]
    fn a_connection_answers_alone_unless_another_answered_just_before() {
        let shared = Shared {
            kv: Default::default(),
            opts: Default::default(),
            watching: Default::default(),
            last_answer: Default::default(),
            epoch: std::time::Instant::now(),
            next_conn: Default::default(),
            counters: Default::default(),
        };
        let busy = OTHERS_BUSY.as_micros() as u64;
        let t = 10 * busy;
        assert!(shared.answered_alone_at(1, t), "nobody answered before");
        assert!(shared.answered_alone_at(1, t + 1), "only itself");
        assert!(
            !shared.answered_alone_at(2, t + 2),
            "connection 1 just answered"
        );
        assert!(
            shared.answered_alone_at(1, t + 2 + busy),
            "connection 2 answered long ago"
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret1"));
        assert!(!ct_eq(b"", b"x"));
        assert!(!ct_eq(b"x\0", b"x"));
    }
}
