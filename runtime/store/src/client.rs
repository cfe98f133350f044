//! The TCP store client.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::calls::Calls;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::client_conn::{conn_err, drive, unexpected, Call, Shared, Wire, MIN_TIMER_LEAD};
use crate::error::StoreError;
use crate::store::{Store, DEFAULT_TIMEOUT};
use crate::wire::{self, op, Encoder, FrameStatus, Reply};
use chorus_core::sync::lock;

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

/// A client of a [`TcpStoreServer`](crate::TcpStoreServer).
///
/// One TCP connection, watched by a driver task on chorus's background
/// runtime. A request made while the connection is idle is written from
/// the caller's thread, and its future reads the reply from the socket
/// itself for a few tens of microseconds before it parks (no thread
/// hand-off either way); requests made while others are in flight are
/// pipelined on the same connection, and a waiting `get` does not hold up
/// other operations. The driver reads whatever the caller does not, flushes
/// what the socket did not take at once, and fails requests when the
/// server closes the connection or does not answer in time, whether or not
/// anyone polls them; the methods can be awaited from any executor (tokio,
/// smol, `futures::executor::block_on`) and from many tasks at once.
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
    shared: Arc<Shared>,
    next_id: AtomicU64,
    request_timeout: Duration,
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        lock(&self.shared.wire).closed = true;
        self.shared.notify.notify_one();
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
        // The caller's side of the socket: the same open socket (non-blocking
        // like the driver's), read and written without tokio's readiness.
        let raw = stream
            .as_fd()
            .try_clone_to_owned()
            .map(std::net::TcpStream::from)
            .map_err(|e| conn_err(addr, format!("cannot share the socket: {e}")))?;
        let shared = Arc::new(Shared {
            addr: addr.to_owned(),
            calls: Calls::new(),
            wire: Mutex::new(Wire::default()),
            raw,
            notify: Notify::new(),
            lead: opts.request_timeout.max(MIN_TIMER_LEAD),
        });
        h.spawn(drive(stream, Arc::clone(&shared)));
        Ok(TcpStore {
            addr: addr.to_owned(),
            local_addr,
            shared,
            next_id: AtomicU64::new(2),
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
        let deadline = deadline_after(op_timeout.saturating_add(self.request_timeout));
        let reads_own_reply = self.shared.submit(id, &frame, deadline)?;
        let reply = Call::new(&self.shared, id, reads_own_reply).await;
        match reply {
            Ok(Reply::Error(e)) => Err(e.into_store_error(op_timeout)),
            r => r,
        }
    }
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

    async fn present(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        match self
            .call(op::PRESENT, Duration::ZERO, keys_len(keys) + 4, |e| {
                e.count(keys.len());
                for k in keys {
                    e.bytes(k.as_bytes());
                }
            })
            .await?
        {
            Reply::Value(v) if v.len() == keys.len() => Ok(v.iter().map(|&b| b != 0).collect()),
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
