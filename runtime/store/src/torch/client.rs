//! [`TorchStore`]: chorus's [`Store`] over a PyTorch TCPStore.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::conn::{conn_err, Conn, Waited};
use super::wire::{self, Query};
use crate::error::StoreError;
use crate::store::{Store, DEFAULT_TIMEOUT};
use chorus_core::sync::lock;

/// What PyTorch's own client puts before every key (its `TCPStore` turns
/// `"k"` into `"/k"` on the server); chorus does the same, so both see one
/// key space. Errors name keys without it.
const KEY_PREFIX: &str = "/";

/// The server's name for `key`.
fn wire_key(key: &str) -> String {
    let mut k = String::with_capacity(KEY_PREFIX.len() + key.len());
    k.push_str(KEY_PREFIX);
    k.push_str(key);
    k
}

fn wire_keys(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| wire_key(k)).collect()
}

/// The caller's name for the server's `key`.
fn user_key(key: &str) -> String {
    key.strip_prefix(KEY_PREFIX).unwrap_or(key).to_owned()
}

/// How long a connection opened after the first keeps retrying: the server
/// was up, so a refusal now means it is gone.
const RECONNECT_WINDOW: Duration = Duration::from_secs(5);

/// Options of [`TorchStore::connect`].
#[derive(Clone, Debug)]
pub struct TorchStoreOptions {
    /// How long [`TorchStore::connect`] keeps retrying while the server is
    /// not up yet (default 300 s, PyTorch's store timeout).
    pub connect_timeout: Duration,
    /// How long a reply may take beyond the operation's own timeout before
    /// the operation fails with [`StoreError::Connection`] (default 60 s).
    pub request_timeout: Duration,
    /// Idle connections kept for the next operations (default 4). Each
    /// operation in flight holds a connection of its own; one that finds
    /// none idle opens another.
    pub max_idle: usize,
}

impl Default for TorchStoreOptions {
    fn default() -> Self {
        TorchStoreOptions {
            connect_timeout: DEFAULT_TIMEOUT,
            request_timeout: Duration::from_secs(60),
            max_idle: 4,
        }
    }
}

/// A client of a PyTorch `torch.distributed.TCPStore` server, such as the
/// one torchrun's elastic agent serves to its workers.
///
/// It speaks PyTorch's own protocol (c10d's, PyTorch 2.3 or later) and
/// implements every [`Store`] operation on it with chorus's size limits,
/// timeouts and errors. Keys are stored as PyTorch's own client stores
/// them (it puts `/` before each), so chorus and PyTorch clients of one
/// server see the same keys.
///
/// * `get` and `multi_get` wait for their keys on the server (no polling),
///   then read them; `wait` likewise. When the timeout expires first, the
///   wait is cancelled on the server and the operation fails with
///   [`StoreError::Timeout`] naming the keys.
/// * `set` and `multi_set`, which get no reply in PyTorch's protocol, are
///   followed by a ping on the same connection: they return once the server
///   has applied them, so what one rank sets before it tells another is
///   there when the other looks.
/// * `add` on a value that is not a decimal integer: the PyTorch server
///   closes the connection; the client reads the value on a new one and
///   fails with [`StoreError::InvalidValue`].
/// * `compare_set` returns the value stored afterwards, empty when the key
///   is still missing (the server itself answers `expected` then).
/// * `num_keys` counts every key the server holds, PyTorch's own
///   included; [`num_keys_with_prefix`](Store::num_keys_with_prefix) is
///   [`StoreError::Unsupported`] (the protocol cannot list keys), so a
///   [`PrefixStore`](crate::PrefixStore)'s `num_keys` over this store is
///   too.
///
/// The protocol's replies carry no request ids, so each operation holds a
/// connection of its own while it runs, and concurrent operations use
/// several connections (up to [`TorchStoreOptions::max_idle`] are kept
/// open between operations). Operations run on chorus's background runtime
/// and can be awaited from any executor.
///
/// **Security.** PyTorch's TCPStore has no authentication: anyone who can
/// reach its port can read and write the job's keys, as with PyTorch
/// itself.
///
/// # Cancel safety
///
/// Dropping an operation's future closes the connection it holds (the
/// server then drops its wait); a dropped `set` may or may not have taken
/// effect.
#[derive(Debug)]
pub struct TorchStore {
    addr: String,
    opts: TorchStoreOptions,
    idle: Arc<Mutex<Vec<Conn>>>,
}

/// An operation with everything it needs, owned so it can run on the
/// background runtime.
#[derive(Debug)]
enum Req {
    Set(String, Vec<u8>),
    Get(String, Duration),
    Add(String, i64),
    CompareSet(String, Vec<u8>, Vec<u8>),
    Wait(Vec<String>, Duration),
    Check(Vec<String>),
    Delete(String),
    NumKeys,
    MultiGet(Vec<String>, Duration),
    MultiSet(Vec<(String, Vec<u8>)>),
}

/// What an operation returns.
#[derive(Debug)]
enum Resp {
    Unit,
    Bytes(Vec<u8>),
    Int(i64),
    Bool(bool),
    Values(Vec<Vec<u8>>),
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

fn timeout_err(keys: Vec<String>, after: Duration) -> StoreError {
    StoreError::Timeout { keys, after }
}

fn unexpected(what: &str, r: Resp) -> StoreError {
    StoreError::Protocol(format!("internal: {what} produced {r:?}"))
}

impl TorchStore {
    /// Connects to the PyTorch TCPStore at `addr` (`"host:port"`),
    /// retrying until `opts.connect_timeout` while it is not up yet, and
    /// checks that it answers as one.
    ///
    /// # Errors
    ///
    /// [`StoreError::Connection`] if no connection could be made in time,
    /// [`StoreError::Protocol`] if the peer is not a PyTorch TCPStore (of
    /// PyTorch 2.3 or later, whose servers answer the client's ping),
    /// [`StoreError::Runtime`] if chorus's I/O threads cannot start.
    pub async fn connect(addr: &str, opts: TorchStoreOptions) -> Result<TorchStore, StoreError> {
        let a = addr.to_owned();
        let deadline = Instant::now()
            .checked_add(opts.connect_timeout)
            .unwrap_or_else(|| Instant::now() + DEFAULT_TIMEOUT);
        let reply = opts.request_timeout;
        let first = crate::rt::run(async move { Conn::open(&a, deadline, reply).await })
            .await
            .map_err(StoreError::Runtime)??;
        tracing::debug!(addr, "connected to a PyTorch TCPStore");
        Ok(TorchStore {
            addr: addr.to_owned(),
            opts,
            idle: Arc::new(Mutex::new(vec![first])),
        })
    }

    /// The server address as given to [`connect`](Self::connect).
    pub fn server_addr(&self) -> &str {
        &self.addr
    }

    /// Runs `req` on an idle connection (or a new one) on the background
    /// runtime; the connection goes back to the pool if the operation left
    /// it between requests.
    async fn run(&self, req: Req) -> Result<Resp, StoreError> {
        let idle = Arc::clone(&self.idle);
        let addr = self.addr.clone();
        let opts = self.opts.clone();
        let (cancel_tx, cancel_rx) = futures::channel::oneshot::channel::<()>();
        // Dropped with this future: the task then drops its connection.
        let _cancel = cancel_tx;
        crate::rt::run(async move {
            let work = async {
                let pooled = lock(&idle).pop();
                let mut conn = match pooled {
                    Some(c) => c,
                    None => {
                        Conn::open(
                            &addr,
                            Instant::now() + RECONNECT_WINDOW,
                            opts.request_timeout,
                        )
                        .await?
                    }
                };
                let out = exec(&mut conn, &req, opts.request_timeout).await;
                let out = match out {
                    Err(StoreError::Connection { cause, .. }) if matches!(req, Req::Add(..)) => {
                        Err(diagnose_add(&addr, &req, cause, &opts).await)
                    }
                    Err(e) => Err(e),
                    Ok(r) => {
                        let mut pool = lock(&idle);
                        if conn.is_idle() && pool.len() < opts.max_idle {
                            pool.push(conn);
                        }
                        Ok(r)
                    }
                };
                out
            };
            tokio::select! {
                r = work => r,
                _ = cancel_rx => Err(StoreError::Runtime("store operation cancelled".into())),
            }
        })
        .await
        .map_err(StoreError::Runtime)?
    }
}

/// Runs one operation on `conn`.
async fn exec(conn: &mut Conn, req: &Req, reply: Duration) -> Result<Resp, StoreError> {
    let soon = || Instant::now() + reply;
    match req {
        Req::Set(k, v) => {
            conn.send(&Query::Set(k, v)).await?;
            applied(conn, soon()).await?;
            Ok(Resp::Unit)
        }
        Req::MultiSet(entries) => {
            let e: Vec<(&str, &[u8])> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_slice()))
                .collect();
            conn.send(&Query::MultiSet(&e)).await?;
            applied(conn, soon()).await?;
            Ok(Resp::Unit)
        }
        Req::Get(k, timeout) => {
            if conn.wait(&[k], *timeout, reply).await? == Waited::TimedOut {
                return Err(timeout_err(vec![user_key(k)], *timeout));
            }
            let v = conn.call(&Query::Get(k), soon()).await?.into_bytes()?;
            Ok(Resp::Bytes(v))
        }
        Req::Add(k, delta) => {
            let v = conn
                .call(&Query::Add(k, *delta), soon())
                .await?
                .into_i64()?;
            Ok(Resp::Int(v))
        }
        Req::CompareSet(k, expected, desired) => {
            let v = conn
                .call(&Query::CompareSet(k, expected, desired), soon())
                .await?
                .into_bytes()?;
            // The server answers `expected` for a missing key when
            // `expected` is not empty; chorus's contract answers empty.
            // `v == expected` with a present key means the swap happened,
            // which answers `desired`: they differ unless expected ==
            // desired, where only a check tells them apart.
            if !expected.is_empty() && v == *expected {
                let missing = expected == desired && !check(conn, &[k.as_str()], soon()).await?;
                if expected != desired || missing {
                    return Ok(Resp::Bytes(Vec::new()));
                }
            }
            Ok(Resp::Bytes(v))
        }
        Req::Wait(keys, timeout) => {
            if keys.is_empty() {
                return Ok(Resp::Unit);
            }
            match conn.wait(&strs(keys), *timeout, reply).await? {
                Waited::Ready => Ok(Resp::Unit),
                Waited::TimedOut => Err(timeout_err(missing(conn, keys, soon()).await?, *timeout)),
            }
        }
        Req::Check(keys) => {
            if keys.is_empty() {
                return Ok(Resp::Bool(true));
            }
            Ok(Resp::Bool(check(conn, &strs(keys), soon()).await?))
        }
        Req::Delete(k) => {
            let n = conn.call(&Query::Delete(k), soon()).await?.into_i64()?;
            Ok(Resp::Bool(n > 0))
        }
        Req::NumKeys => {
            let n = conn.call(&Query::NumKeys, soon()).await?.into_i64()?;
            Ok(Resp::Int(n))
        }
        Req::MultiGet(keys, timeout) => {
            if keys.is_empty() {
                return Ok(Resp::Values(Vec::new()));
            }
            let k = strs(keys);
            if conn.wait(&k, *timeout, reply).await? == Waited::TimedOut {
                return Err(timeout_err(missing(conn, keys, soon()).await?, *timeout));
            }
            let v = conn
                .call(&Query::MultiGet(&k), soon())
                .await?
                .into_values()?;
            Ok(Resp::Values(v))
        }
    }
}

/// Waits for the server to have applied what this connection sent: it
/// answers requests in order, so a ping's echo comes after.
async fn applied(conn: &mut Conn, deadline: Instant) -> Result<(), StoreError> {
    const NONCE: u32 = 0x6368_6f72;
    let echo = conn.call(&Query::Ping(NONCE), deadline).await?.into_u32()?;
    if echo != NONCE {
        return Err(StoreError::Protocol(format!(
            "PyTorch TCPStore at {} echoed {echo:#x} to ping {NONCE:#x}",
            conn.addr()
        )));
    }
    Ok(())
}

async fn check(conn: &mut Conn, keys: &[&str], deadline: Instant) -> Result<bool, StoreError> {
    wire::check_ready(
        conn.call(&Query::Check(keys), deadline)
            .await?
            .into_byte()?,
    )
}

/// The keys of `keys` that do not exist, for a timeout's message.
async fn missing(
    conn: &mut Conn,
    keys: &[String],
    deadline: Instant,
) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for k in keys {
        if !check(conn, &[k.as_str()], deadline).await? {
            out.push(user_key(k));
        }
    }
    Ok(out)
}

/// An `add` lost its connection: if the value is not an integer (which
/// makes the PyTorch server close the connection), says so.
async fn diagnose_add(
    addr: &str,
    req: &Req,
    cause: String,
    opts: &TorchStoreOptions,
) -> StoreError {
    let Req::Add(key, _) = req else {
        return conn_err(addr, cause);
    };
    let look = async {
        let mut c = Conn::open(
            addr,
            Instant::now() + RECONNECT_WINDOW,
            opts.request_timeout,
        )
        .await?;
        c.call(&Query::Get(key), Instant::now() + opts.request_timeout)
            .await?
            .into_bytes()
    };
    match look.await {
        Ok(v) if !v.is_empty() && parse_i64(&v).is_none() => StoreError::InvalidValue {
            key: user_key(key),
            msg: format!(
                "add needs a decimal integer, the value is {:?}",
                String::from_utf8_lossy(&v[..v.len().min(64)])
            ),
        },
        _ => conn_err(addr, cause),
    }
}

fn parse_i64(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

#[async_trait::async_trait]
impl Store for TorchStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Query::Set(key, value).check()?;
        match self.run(Req::Set(wire_key(key), value.into())).await? {
            Resp::Unit => Ok(()),
            r => Err(unexpected("set", r)),
        }
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        Query::Get(key).check()?;
        match self.run(Req::Get(wire_key(key), timeout)).await? {
            Resp::Bytes(v) => Ok(v),
            r => Err(unexpected("get", r)),
        }
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        Query::Add(key, delta).check()?;
        match self.run(Req::Add(wire_key(key), delta)).await? {
            Resp::Int(v) => Ok(v),
            r => Err(unexpected("add", r)),
        }
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        Query::CompareSet(key, expected, desired).check()?;
        let req = Req::CompareSet(wire_key(key), expected.into(), desired.into());
        match self.run(req).await? {
            Resp::Bytes(v) => Ok(v),
            r => Err(unexpected("compare_set", r)),
        }
    }

    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        Query::Wait(keys).check()?;
        let req = Req::Wait(wire_keys(keys), timeout);
        match self.run(req).await? {
            Resp::Unit => Ok(()),
            r => Err(unexpected("wait", r)),
        }
    }

    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        Query::Check(keys).check()?;
        let req = Req::Check(wire_keys(keys));
        match self.run(req).await? {
            Resp::Bool(b) => Ok(b),
            r => Err(unexpected("check", r)),
        }
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        Query::Delete(key).check()?;
        match self.run(Req::Delete(wire_key(key))).await? {
            Resp::Bool(b) => Ok(b),
            r => Err(unexpected("delete", r)),
        }
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        match self.run(Req::NumKeys).await? {
            Resp::Int(n) => u64::try_from(n)
                .map_err(|_| StoreError::Protocol(format!("PyTorch TCPStore reports {n} keys"))),
            r => Err(unexpected("num_keys", r)),
        }
    }

    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        Query::MultiGet(keys).check()?;
        let req = Req::MultiGet(wire_keys(keys), timeout);
        match self.run(req).await? {
            Resp::Values(v) if v.len() == keys.len() => Ok(v),
            r => Err(unexpected("multi_get", r)),
        }
    }

    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        Query::MultiSet(entries).check()?;
        if entries.is_empty() {
            return Ok(());
        }
        let req = Req::MultiSet(
            entries
                .iter()
                .map(|(k, v)| (wire_key(k), v.to_vec()))
                .collect(),
        );
        match self.run(req).await? {
            Resp::Unit => Ok(()),
            r => Err(unexpected("multi_set", r)),
        }
    }
}
