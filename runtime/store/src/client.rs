//! The TCP store client.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use std::sync::{Arc, Mutex};

use crate::error::StoreError;
use crate::io::{InBuf, OutBuf, OUT_HIGH_WATER};
use crate::lock::lock;
use crate::store::{Store, DEFAULT_TIMEOUT};
use crate::wire::{self, op, Encoder, FrameStatus, Reply};

/// Options of [`TcpStore::connect`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Shared token, sent in the hello frame; must match the server's.
    pub token: Option<String>,
    /// How long [`TcpStore::connect`] keeps retrying while the server is not
    /// up yet (default 300 s, like PyTorch's store timeout).
    pub connect_timeout: Duration,
    /// How long a reply may take beyond the operation's own timeout before
    /// the operation fails with [`StoreError::Connection`] (default 60 s):
    /// the guard against a server that stopped answering without closing
    /// the connection.
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            connect_timeout: DEFAULT_TIMEOUT,
            request_timeout: Duration::from_secs(60),
        }
    }
}

impl ClientOptions {
    /// Defaults, with the token read from `CHORUS_STORE_TOKEN` (unset or
    /// empty: no token).
    pub fn from_env() -> Self {
        ClientOptions {
            token: crate::config::token(),
            ..Self::default()
        }
    }
}

/// A request on its way to the connection task.
#[derive(Debug)]
struct Cmd {
    id: u64,
    frame: Vec<u8>,
    deadline: Instant,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// A client of a [`TcpStoreServer`](crate::TcpStoreServer).
///
/// One TCP connection, owned by a task on chorus's background runtime; the
/// methods hand it requests through channels, so they can be awaited from
/// any executor (tokio, smol, `futures::executor::block_on`) and from many
/// tasks at once: requests are pipelined, and a waiting `get` does not hold
/// up other operations.
///
/// The connection is not re-established: once it fails, every operation
/// fails with the [`StoreError::Connection`] that ended it.
///
/// # Cancel safety
///
/// Dropping an operation's future does not recall its request: a dropped
/// `set` may or may not have taken effect.
#[derive(Debug)]
pub struct TcpStore {
    addr: String,
    local_addr: SocketAddr,
    tx: mpsc::UnboundedSender<Cmd>,
    next_id: AtomicU64,
    /// Why the connection ended, once it has.
    dead: Arc<Mutex<Option<StoreError>>>,
    request_timeout: Duration,
}

fn conn_err(addr: &str, cause: impl std::fmt::Display) -> StoreError {
    StoreError::Connection {
        addr: addr.to_owned(),
        cause: cause.to_string(),
    }
}

/// `now + d`, saturating far in the future instead of overflowing.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

impl TcpStore {
    /// Connects to the server at `addr` (`"host:port"`), retrying until
    /// `opts.connect_timeout` while it is not up yet, then says hello (with
    /// the token, if any).
    ///
    /// Callable from any executor.
    ///
    /// # Errors
    ///
    /// [`StoreError::Connection`] if no connection could be made within the
    /// timeout (the last cause included), [`StoreError::Auth`] if the
    /// server refused the token, [`StoreError::Protocol`] if the peer does
    /// not speak this protocol, [`StoreError::Runtime`] if chorus's I/O
    /// threads cannot start.
    pub async fn connect(addr: &str, opts: ClientOptions) -> Result<TcpStore, StoreError> {
        if let Some(t) = &opts.token {
            if t.len() > wire::MAX_TOKEN_LEN {
                return Err(StoreError::TooLarge {
                    what: "token",
                    len: t.len(),
                    limit: wire::MAX_TOKEN_LEN,
                });
            }
        }
        let h = crate::rt::handle().map_err(StoreError::Runtime)?;
        let addr_s = addr.to_owned();
        let o = opts.clone();
        let (stream, local_addr) = h
            .spawn(async move { open(&addr_s, &o).await })
            .await
            .map_err(|e| StoreError::Runtime(e.to_string()))??;
        let (tx, rx) = mpsc::unbounded_channel();
        let dead = Arc::new(Mutex::new(None));
        h.spawn(connection(stream, rx, Arc::clone(&dead), addr.to_owned()));
        Ok(TcpStore {
            addr: addr.to_owned(),
            local_addr,
            tx,
            next_id: AtomicU64::new(2),
            dead,
            request_timeout: opts.request_timeout,
        })
    }

    /// The local side of the connection: its IP is this host's address on
    /// the network that reaches the server.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The server address as given to [`connect`](Self::connect).
    pub fn server_addr(&self) -> &str {
        &self.addr
    }

    fn dead_error(&self) -> StoreError {
        lock(&self.dead)
            .clone()
            .unwrap_or_else(|| conn_err(&self.addr, "connection closed"))
    }

    /// Sends one request built by `body` and waits for its reply.
    async fn call(
        &self,
        opcode: u8,
        op_timeout: Duration,
        size_hint: usize,
        body: impl FnOnce(&mut Encoder<'_>),
    ) -> Result<Reply, StoreError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(wire::LEN_PREFIX + wire::HEADER_LEN + size_hint);
        let mut enc = Encoder::begin(&mut frame, opcode, id);
        body(&mut enc);
        let total = enc.finish();
        if total - wire::LEN_PREFIX > wire::MAX_FRAME_LEN {
            return Err(StoreError::TooLarge {
                what: "frame",
                len: total - wire::LEN_PREFIX,
                limit: wire::MAX_FRAME_LEN,
            });
        }
        let (reply, rx) = oneshot::channel();
        let deadline = deadline_after(op_timeout.saturating_add(self.request_timeout));
        self.tx
            .send(Cmd {
                id,
                frame,
                deadline,
                reply,
            })
            .map_err(|_| self.dead_error())?;
        match rx.await {
            Ok(Ok(Reply::Error(e))) => Err(e.into_store_error(op_timeout)),
            Ok(r) => r,
            Err(_) => Err(self.dead_error()),
        }
    }
}

fn unexpected(r: Reply) -> StoreError {
    StoreError::Protocol(format!("unexpected reply {r:?}"))
}

fn keys_len(keys: &[&str]) -> usize {
    keys.iter().map(|k| k.len() + 4).sum()
}

#[async_trait::async_trait]
impl Store for TcpStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        wire::check_key(key)?;
        wire::check_value(value)?;
        let size = key.len() + value.len() + 8;
        match self
            .call(op::SET, Duration::ZERO, size, |e| {
                e.bytes(key.as_bytes()).bytes(value);
            })
            .await?
        {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        wire::check_key(key)?;
        match self
            .call(op::GET, timeout, key.len() + 12, |e| {
                e.bytes(key.as_bytes()).timeout(timeout);
            })
            .await?
        {
            Reply::Value(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        wire::check_key(key)?;
        match self
            .call(op::ADD, Duration::ZERO, key.len() + 12, |e| {
                e.bytes(key.as_bytes()).i64(delta);
            })
            .await?
        {
            Reply::Int(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        wire::check_key(key)?;
        wire::check_value(expected)?;
        wire::check_value(desired)?;
        let size = key.len() + expected.len() + desired.len() + 12;
        match self
            .call(op::COMPARE_SET, Duration::ZERO, size, |e| {
                e.bytes(key.as_bytes()).bytes(expected).bytes(desired);
            })
            .await?
        {
            Reply::Value(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        match self
            .call(op::WAIT, timeout, keys_len(keys) + 12, |e| {
                e.count(keys.len());
                for k in keys {
                    e.bytes(k.as_bytes());
                }
                e.timeout(timeout);
            })
            .await?
        {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        match self
            .call(op::CHECK, Duration::ZERO, keys_len(keys) + 4, |e| {
                e.count(keys.len());
                for k in keys {
                    e.bytes(k.as_bytes());
                }
            })
            .await?
        {
            Reply::Bool(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        wire::check_key(key)?;
        match self
            .call(op::DELETE, Duration::ZERO, key.len() + 4, |e| {
                e.bytes(key.as_bytes());
            })
            .await?
        {
            Reply::Bool(b) => Ok(b),
            r => Err(unexpected(r)),
        }
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        self.num_keys_with_prefix("").await
    }

    async fn num_keys_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        wire::check_key(prefix)?;
        match self
            .call(op::NUM_KEYS, Duration::ZERO, prefix.len() + 4, |e| {
                e.bytes(prefix.as_bytes());
            })
            .await?
        {
            Reply::Count(n) => Ok(n),
            r => Err(unexpected(r)),
        }
    }

    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        match self
            .call(op::MULTI_GET, timeout, keys_len(keys) + 12, |e| {
                e.count(keys.len());
                for k in keys {
                    e.bytes(k.as_bytes());
                }
                e.timeout(timeout);
            })
            .await?
        {
            Reply::Values(v) if v.len() == keys.len() => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        wire::check_keys(entries.len(), entries.iter().map(|(k, _)| *k))?;
        entries.iter().try_for_each(|(_, v)| wire::check_value(v))?;
        let size = entries
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
            + 4;
        if size > wire::MAX_FRAME_LEN {
            return Err(StoreError::TooLarge {
                what: "frame",
                len: size,
                limit: wire::MAX_FRAME_LEN,
            });
        }
        match self
            .call(op::MULTI_SET, Duration::ZERO, size, |e| {
                e.count(entries.len());
                for (k, v) in entries {
                    e.bytes(k.as_bytes()).bytes(v);
                }
            })
            .await?
        {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }
}

// ---------------------------------------------------------------- connection

/// Connects (with retries) and says hello. Runs on the rt runtime.
async fn open(addr: &str, opts: &ClientOptions) -> Result<(TcpStream, SocketAddr), StoreError> {
    let start = Instant::now();
    let deadline = deadline_after(opts.connect_timeout);
    let mut backoff = Duration::from_millis(5);
    let stream = loop {
        let attempt = tokio::time::timeout_at(deadline.into(), TcpStream::connect(addr)).await;
        let cause = match attempt {
            Ok(Ok(s)) => break s,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        if Instant::now() + backoff >= deadline {
            return Err(conn_err(
                addr,
                format!("{cause} (kept trying for {:?})", start.elapsed()),
            ));
        }
        tracing::trace!(addr, cause, "store connect: retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(250));
    };
    let _ = stream.set_nodelay(true);
    let local_addr = stream.local_addr().map_err(|e| conn_err(addr, e))?;

    // Hello: version check, and the token if any.
    let mut buf = Vec::new();
    let mut enc = Encoder::begin(&mut buf, op::HELLO, 1);
    enc.bytes(opts.token.as_deref().unwrap_or("").as_bytes());
    enc.finish();
    // The hello is part of connecting: it shares the connect deadline, but
    // a connection made at the last moment still gets a second for it.
    let hello_deadline = deadline.max(deadline_after(Duration::from_secs(1)));
    let reply = tokio::time::timeout_at(hello_deadline.into(), async {
        let mut out: &[u8] = &buf;
        while !out.is_empty() {
            stream.writable().await?;
            match stream.try_write(out) {
                Ok(n) => out = &out[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let mut rbuf = Vec::with_capacity(256);
        loop {
            stream.readable().await?;
            match stream.try_read_buf(&mut rbuf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "server closed the connection during hello",
                    ))
                }
                Ok(_) => match wire::check_frame(&rbuf, wire::MAX_HELLO_FRAME_LEN * 16) {
                    Ok(FrameStatus::Complete { total }) => {
                        let (kind, _, body) = wire::split_frame(&rbuf[..total]);
                        return Ok(Reply::decode(kind, body));
                    }
                    Ok(FrameStatus::Partial) => rbuf.reserve(256),
                    Err(e) => return Ok(Err(e)),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .map_err(|_| conn_err(addr, "no reply to hello"))?
    .map_err(|e| conn_err(addr, e))??;
    match reply {
        Reply::Ok => Ok((stream, local_addr)),
        Reply::Error(wire::WireError::Auth(m)) => Err(StoreError::Auth(m)),
        Reply::Error(e) => Err(e.into_store_error(Duration::ZERO)),
        r => Err(unexpected(r)),
    }
}

/// Requests sent and not yet answered: reply channel and deadline.
type Pending = HashMap<u64, (oneshot::Sender<Result<Reply, StoreError>>, Instant)>;

/// The connection task's state.
struct Conn {
    addr: String,
    pending: Pending,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    out: OutBuf,
    inbuf: InBuf,
}

impl Conn {
    fn accept(&mut self, cmd: Cmd) {
        self.out.buf().extend_from_slice(&cmd.frame);
        self.pending.insert(cmd.id, (cmd.reply, cmd.deadline));
        self.deadlines.push(Reverse((cmd.deadline, cmd.id)));
        // Entries of answered requests stay in the heap until they come to
        // the top; rebuild it when they outnumber the live ones.
        if self.deadlines.len() > 2 * self.pending.len() + 1024 {
            self.deadlines = self
                .pending
                .iter()
                .map(|(id, (_, d))| Reverse((*d, *id)))
                .collect();
        }
    }

    /// Fails requests whose reply is overdue; returns the next deadline.
    fn expire(&mut self) -> Option<Instant> {
        let now = Instant::now();
        while let Some(Reverse((d, id))) = self.deadlines.peek().copied() {
            if !self.pending.contains_key(&id) {
                self.deadlines.pop();
                continue;
            }
            if d > now {
                return Some(d);
            }
            self.deadlines.pop();
            if let Some((tx, _)) = self.pending.remove(&id) {
                let _ = tx.send(Err(conn_err(
                    &self.addr,
                    "no reply from the server in time (request_timeout past the operation's own timeout)",
                )));
            }
        }
        None
    }

    fn fail_all(&mut self, e: &StoreError) {
        for (_, (tx, _)) in self.pending.drain() {
            let _ = tx.send(Err(e.clone()));
        }
        self.deadlines.clear();
    }
}

/// Dispatches every complete reply in the read buffer.
fn dispatch(inb: &mut InBuf, pending: &mut Pending) -> Result<(), StoreError> {
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
                if let Some((tx, _)) = pending.remove(&id) {
                    let _ = tx.send(Ok(reply));
                }
            }
        }
    };
    inb.consume(pos);
    result
}

/// Errors of the read path.
enum ReadErr {
    Io(io::Error),
    Store(StoreError),
}

impl From<io::Error> for ReadErr {
    fn from(e: io::Error) -> Self {
        ReadErr::Io(e)
    }
}

/// Owns the connection: writes requests, reads replies, enforces reply
/// deadlines. Ends when every [`TcpStore`] handle is gone and its requests
/// are written, or when the connection fails.
async fn connection(
    stream: TcpStream,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    dead: Arc<Mutex<Option<StoreError>>>,
    addr: String,
) {
    let mut c = Conn {
        addr,
        pending: HashMap::new(),
        deadlines: BinaryHeap::new(),
        out: OutBuf::default(),
        inbuf: InBuf::default(),
    };
    let mut closed = false;
    let end: StoreError = loop {
        // Take queued requests.
        while !closed && c.out.pending() < OUT_HIGH_WATER {
            match rx.try_recv() {
                Ok(cmd) => c.accept(cmd),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
            }
        }
        // Send them.
        match c.out.flush(&stream) {
            Ok(true) if closed => break conn_err(&c.addr, "store client dropped"),
            Ok(_) => {}
            Err(e) => break conn_err(&c.addr, format!("write failed: {e}")),
        }
        let next = c.expire();
        let room = !closed && c.out.pending() < OUT_HIGH_WATER;
        let must_write = c.out.pending() > 0;
        tokio::select! {
            cmd = rx.recv(), if room => match cmd {
                Some(cmd) => c.accept(cmd),
                None => closed = true,
            },
            r = stream.readable() => {
                if let Err(e) = r {
                    break conn_err(&c.addr, format!("read failed: {e}"));
                }
                let pending = &mut c.pending;
                match c.inbuf.read_ready(&stream, 16, |inb| dispatch(inb, pending).map_err(ReadErr::Store)) {
                    Ok(false) => {}
                    Ok(true) => break conn_err(&c.addr, "server closed the connection"),
                    Err(ReadErr::Io(e)) => break conn_err(&c.addr, format!("read failed: {e}")),
                    Err(ReadErr::Store(e)) => break e,
                }
            }
            r = stream.writable(), if must_write => if let Err(e) = r {
                break conn_err(&c.addr, format!("write failed: {e}"));
            },
            _ = sleep_until_opt(next), if next.is_some() => {}
        }
    };
    *lock(&dead) = Some(end.clone());
    rx.close();
    while let Ok(cmd) = rx.try_recv() {
        let _ = cmd.reply.send(Err(end.clone()));
    }
    c.fail_all(&end);
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => futures::future::pending().await,
    }
}
