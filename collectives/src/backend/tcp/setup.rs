//! Setting up and opening connections: every rank listens and publishes
//! its address in the store ([`listen`]); a connection to a peer is opened
//! when an op first needs it ([`dial`] on one side, [`accept_stream`] on
//! the other, run by the `acceptor`). Both ends of a new connection send a
//! [`Hello`] and check the other's; who keeps which connection when both
//! dial at once is in `links`.
//!
//! The published address is `ip:port`, followed by ` unix={host}/{name}`
//! when [`TcpOptions::local_unix_sockets`] is on: `host` identifies this
//! host and network namespace, `name` an abstract Unix socket. A peer with
//! the same `host` connects through the Unix socket (several times faster
//! than loopback TCP); any other peer, or one whose Unix connect fails, uses
//! TCP. Over a Unix socket, when both hellos offer shared memory, both ends
//! then exchange their shared-memory segments (`shm::exchange`) before the
//! connection carries frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::{Store, StoreError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixListener, UnixStream};

use super::halves::{ReadHalf, Sock, WriteHalf};
use super::links::Taking;
use super::options::TcpOptions;
use super::shm;
use super::wire::{
    Hello, HELLO_BCAST, HELLO_CHECKED, HELLO_DUP, HELLO_FIXED, HELLO_SAME_HOST, HELLO_SHM,
};

/// Who this rank is, for the handshake.
#[derive(Clone, Debug)]
pub(super) struct Me {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: Arc<str>,
    pub(super) opts: TcpOptions,
    /// This rank's broadcast segment, offered to every local peer.
    pub(super) bcast: Option<Arc<shm::Bcast>>,
    /// The checked mode (every rank must agree).
    pub(super) checked: bool,
}

impl Me {
    /// Our hello to `to`; `same_host`: `to` published the same host as
    /// this rank (only the connecting side knows); `dup`: an acceptor's
    /// answer refusing the connection (see [`HELLO_DUP`]).
    fn hello(&self, to: usize, same_host: bool, dup: bool) -> Hello {
        Hello {
            group: self.group.to_string(),
            from: self.rank as u32,
            to: to as u32,
            size: self.size as u32,
            crossover: self.opts.crossover_bytes as u64,
            chunk: self.opts.chunk_bytes as u64,
            flags: if self.wants_shm() { HELLO_SHM } else { 0 }
                | if self.bcast.is_some() { HELLO_BCAST } else { 0 }
                | if same_host { HELLO_SAME_HOST } else { 0 }
                | if self.checked { HELLO_CHECKED } else { 0 }
                | if dup { HELLO_DUP } else { 0 },
        }
    }

    /// Whether this rank offers shared memory to local peers.
    pub(super) fn wants_shm(&self) -> bool {
        self.opts.shared_memory
            && (shm::SHM_MIN..=shm::SHM_MAX_CHUNK).contains(&self.opts.chunk_bytes)
    }

    /// Whether a pair whose peer sent `h` uses shared memory (if its
    /// connection is a Unix socket): both ends must offer it.
    fn pair_shm(&self, h: &Hello) -> bool {
        self.wants_shm() && h.flags & HELLO_SHM != 0
    }

    /// Checks a peer's hello; `from` is the rank we expect, if known.
    fn check(&self, h: &Hello, from: Option<usize>) -> Result<usize, String> {
        if h.group != *self.group {
            return Err(format!(
                "peer belongs to group '{}', this rank to group '{}'",
                h.group, self.group
            ));
        }
        if h.size as usize != self.size {
            return Err(format!(
                "peer (rank {}) thinks the group has {} ranks, this rank thinks {}",
                h.from, h.size, self.size
            ));
        }
        if h.to as usize != self.rank {
            return Err(format!(
                "peer (rank {}) meant to reach rank {}, but this is rank {} (stale address in the store?)",
                h.from, h.to, self.rank
            ));
        }
        let peer = h.from as usize;
        if peer == self.rank || peer >= self.size {
            return Err(format!(
                "a peer claims to be rank {peer}, which is not another rank of this group of {}",
                self.size
            ));
        }
        if let Some(f) = from.filter(|&f| f != peer) {
            return Err(format!(
                "expected rank {f} at this address but rank {peer} answered (stale address in the store?)"
            ));
        }
        if h.crossover != self.opts.crossover_bytes as u64
            || h.chunk != self.opts.chunk_bytes as u64
        {
            return Err(format!(
                "rank {peer} uses crossover_bytes={} chunk_bytes={}, this rank uses {} and {}: every rank must use the same TcpOptions",
                h.crossover, h.chunk, self.opts.crossover_bytes, self.opts.chunk_bytes
            ));
        }
        let theirs = h.flags & HELLO_CHECKED != 0;
        if theirs != self.checked {
            let mode = |on: bool| if on { "runs" } else { "does not run" };
            return Err(format!(
                "rank {peer} {} the checked mode and this rank {} it: set GroupBuilder::check_ops (CHORUS_CHECK_OPS) alike on every rank",
                mode(theirs),
                mode(self.checked)
            ));
        }
        Ok(peer)
    }
}

/// A connection to a peer: TCP, or a Unix socket for a peer on this host.
#[derive(Debug)]
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A connection and, for a local peer, its shared-memory segments.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: Stream,
    pub(super) shm: shm::Pair,
}

impl Conn {
    fn plain(stream: Stream) -> Conn {
        Conn {
            stream,
            shm: shm::Pair::default(),
        }
    }
}

/// Socket buffer size asked for on Unix sockets: a chunk or more fits, so a
/// write rarely waits for the reader (the kernel caps it at
/// `net.core.wmem_max` / `rmem_max`).
pub(super) const UNIX_SOCKET_BUFFER: usize = 4 << 20;

impl Stream {
    /// Sets socket buffer sizes (best effort).
    pub(super) fn tune_buffers(&self, bytes: usize) {
        let r = match self {
            Stream::Tcp(_) => return,
            Stream::Unix(s) => {
                let sock = socket2::SockRef::from(s);
                sock.set_send_buffer_size(bytes)
                    .and_then(|()| sock.set_recv_buffer_size(bytes))
            }
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "cannot enlarge the socket buffers");
        }
    }

    /// The connection's two halves, taken out of tokio's hands (see
    /// `halves`).
    ///
    /// # Errors
    ///
    /// The OS error if tokio cannot let go of the socket.
    pub(super) fn split(self) -> std::io::Result<(ReadHalf, WriteHalf)> {
        let sock = match self {
            Stream::Tcp(s) => Sock::Tcp(s.into_std()?),
            Stream::Unix(s) => Sock::Unix(s.into_std()?),
        };
        Ok(sock.split())
    }
}

async fn read_hello<S: AsyncRead + Unpin>(s: &mut S) -> Result<Hello, String> {
    let mut fixed = [0u8; HELLO_FIXED];
    s.read_exact(&mut fixed)
        .await
        .map_err(|e| format!("reading the handshake: {e}"))?;
    let (mut h, n) = Hello::decode_fixed(&fixed)?;
    let mut name = vec![0u8; n];
    s.read_exact(&mut name)
        .await
        .map_err(|e| format!("reading the handshake: {e}"))?;
    h.group =
        String::from_utf8(name).map_err(|_| "group name in handshake is not UTF-8".to_string())?;
    Ok(h)
}

/// `TCP_NODELAY`, and the liveness timeout `live` (zero: none) as kernel
/// keepalive probes and `TCP_USER_TIMEOUT`: a silent link (partition,
/// stopped host) ends the connection with `ETIMEDOUT` within `live`, whether
/// this side waits for data (the probes go unanswered) or has data on the
/// wire (it stays unacknowledged). A live peer's kernel answers the probes
/// whatever its process does, so a slow op never trips it.
fn tune(s: &TcpStream, live: Duration) -> Result<(), String> {
    s.set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    if live.is_zero() {
        return Ok(());
    }
    // Idle a third of the timeout, then 3 probes a sixth apart: the last
    // one goes unanswered at five sixths of it.
    let idle = (live / 3).max(Duration::from_secs(1));
    let probe = (live / 6).max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(probe)
        .with_retries(3);
    let sock = socket2::SockRef::from(s);
    sock.set_tcp_keepalive(&keepalive)
        .map_err(|e| format!("cannot set TCP keepalive: {e}"))?;
    sock.set_tcp_user_timeout(Some(live))
        .map_err(|e| format!("cannot set TCP_USER_TIMEOUT: {e}"))
}

/// Why an incoming connection was not taken; `fatal` when it came from a
/// rank of this very group (same name), whose settings disagree with ours:
/// the group fails at once instead of waiting for a timeout.
pub(super) struct Refused {
    pub(super) msg: String,
    pub(super) fatal: bool,
    /// Not an error: the pair's connection is the one this rank dials (see
    /// [`HELLO_DUP`]).
    pub(super) dup: bool,
}

/// Accepts one connection's handshake: reads the peer's hello, answers with
/// ours, checks theirs. `take(peer)` says whether this rank takes a
/// connection from `peer` (a refusal's answer carries [`HELLO_DUP`]; a
/// stopped rank does not answer); it is only asked about a peer whose
/// hello checked out.
async fn accept_one<S: AsyncRead + AsyncWrite + Unpin>(
    me: &Me,
    mut s: S,
    take: &(dyn Fn(usize) -> Taking + Sync),
) -> Result<(usize, S, Hello), Refused> {
    let stray = |msg: String| Refused {
        msg,
        fatal: false,
        dup: false,
    };
    let h = read_hello(&mut s).await.map_err(stray)?;
    let checked = me.check(&h, None);
    let taking = checked.as_ref().map_or(Taking::Take, |&peer| take(peer));
    if taking == Taking::Closed {
        return Err(stray("this rank stopped".into()));
    }
    let dup = taking == Taking::Dup;
    // Answer before reporting a failed check, so that the peer sees our
    // side and reports the mismatch too.
    s.write_all(&me.hello(h.from as usize, false, dup).encode())
        .await
        .map_err(|e| stray(format!("writing the handshake: {e}")))?;
    let peer = checked.map_err(|msg| Refused {
        msg,
        fatal: h.group == *me.group,
        dup: false,
    })?;
    if dup {
        return Err(Refused {
            msg: format!("rank {peer} dialled while this rank dials it"),
            fatal: false,
            dup: true,
        });
    }
    Ok((peer, s, h))
}

/// Sends our hello to `peer` and checks the answer. A peer that accepted
/// the connection and then closed or reset it is gone.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    me: &Me,
    peer: usize,
    s: &mut S,
    addr: &str,
    same_host: bool,
) -> Result<Hello, SetupError> {
    s.write_all(&me.hello(peer, same_host, false).encode())
        .await
        .map_err(|e| SetupError::Gone(format!("writing the handshake to it at {addr}: {e}")))?;
    let h = read_hello(s)
        .await
        .map_err(|e| SetupError::Gone(format!("at {addr}: {e}")))?;
    me.check(&h, Some(peer))?;
    Ok(h)
}

/// The next incoming connection on either listener, with where it came from.
pub(super) async fn accept_any(
    tcp: &TcpListener,
    unix: Option<&UnixListener>,
) -> std::io::Result<(Stream, String)> {
    let unix_accept = async {
        match unix {
            Some(u) => u.accept().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = tcp.accept() => r.map(|(s, from)| (Stream::Tcp(s), from.to_string())),
        r = unix_accept => r.map(|(s, _)| (Stream::Unix(s), "a local Unix socket".to_string())),
    }
}

/// Runs the acceptor's side of the handshake on either kind of stream;
/// `take` as in [`accept_one`].
pub(super) async fn accept_stream(
    me: &Me,
    s: Stream,
    take: &(dyn Fn(usize) -> Taking + Sync),
) -> Result<(usize, Conn), Refused> {
    let failed = |msg: String| Refused {
        msg,
        fatal: false,
        dup: false,
    };
    match s {
        Stream::Tcp(s) => {
            tune(&s, me.opts.liveness_timeout).map_err(failed)?;
            let (peer, s, _) = accept_one(me, s, take).await?;
            Ok((peer, Conn::plain(Stream::Tcp(s))))
        }
        Stream::Unix(s) => {
            let (peer, mut s, h) = accept_one(me, s, take).await?;
            let shm = if me.pair_shm(&h) {
                shm::exchange(&mut s, peer, me.opts.chunk_bytes, me.bcast.as_deref())
                    .await
                    .map_err(failed)?
            } else {
                shm::Pair::default()
            };
            Ok((
                peer,
                Conn {
                    stream: Stream::Unix(s),
                    shm,
                },
            ))
        }
    }
}

/// How long a dialler retries a refused TCP connection.
const REFUSED_RETRIES: Duration = Duration::from_millis(200);

/// Connects to `peer` at `addr`, retrying refused connections briefly (by
/// `deadline` at the latest), and runs the handshake.
async fn connect_tcp(
    me: &Me,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
    same_host: bool,
) -> Result<(TcpStream, Hello), SetupError> {
    // The peer listens before it publishes its address, so a refused
    // connection means it is gone: a few quick retries only (a backlog
    // that overflowed), not the whole deadline.
    let give_up = deadline.min(Instant::now() + REFUSED_RETRIES);
    let mut backoff = Duration::from_millis(5);
    let mut s = loop {
        match TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if Instant::now() + backoff < give_up => {
                tracing::debug!(peer, %addr, error = %e, "connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            // It listened before it published the address: it is gone.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(SetupError::Gone(format!(
                    "it no longer accepts connections at {addr} ({e})"
                )))
            }
            Err(e) => return Err(format!("cannot connect to rank {peer} at {addr}: {e}").into()),
        }
    };
    tune(&s, me.opts.liveness_timeout)?;
    let h = handshake(me, peer, &mut s, &addr.to_string(), same_host).await?;
    Ok((s, h))
}

/// This host and network namespace (abstract Unix sockets are per network
/// namespace), or `None` where Unix sockets are not used.
#[cfg(target_os = "linux")]
fn host_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/net").ok()?;
    let id = format!("{}-{}", boot.trim(), ns.to_string_lossy());
    // Keep the published address one token of plain characters.
    Some(
        id.chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect(),
    )
}

#[cfg(not(target_os = "linux"))]
fn host_id() -> Option<String> {
    None
}

/// A listener on a fresh abstract Unix socket; returns it and its name.
#[cfg(target_os = "linux")]
fn unix_listener(me: &Me) -> Result<(UnixListener, String), String> {
    use std::os::linux::net::SocketAddrExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!(
        "chorus-{}-{:08x}-{}-{nanos}",
        std::process::id(),
        super::wire::group_hash(&me.group),
        me.rank
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| format!("bad abstract socket name: {e}"))?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)
        .map_err(|e| format!("cannot bind a Unix socket: {e}"))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("cannot make the Unix socket non-blocking: {e}"))?;
    let l =
        UnixListener::from_std(l).map_err(|e| format!("cannot register the Unix socket: {e}"))?;
    Ok((l, name))
}

#[cfg(not(target_os = "linux"))]
fn unix_listener(_: &Me) -> Result<(UnixListener, String), String> {
    Err("Unix sockets for local peers are only used on Linux".into())
}

/// Connects to a peer's abstract Unix socket (no handshake yet).
#[cfg(target_os = "linux")]
async fn connect_unix(peer: usize, name: &str) -> Result<UnixStream, String> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| format!("bad abstract socket name: {e}"))?;
    // A blocking connect, which only waits if the listener's backlog is
    // full: off the I/O threads.
    let s =
        tokio::task::spawn_blocking(move || std::os::unix::net::UnixStream::connect_addr(&addr))
            .await
            .map_err(|e| format!("Unix socket connect task failed: {e}"))?
            .map_err(|e| format!("cannot connect to rank {peer}'s Unix socket: {e}"))?;
    s.set_nonblocking(true)
        .map_err(|e| format!("cannot make the Unix socket non-blocking: {e}"))?;
    UnixStream::from_std(s).map_err(|e| format!("cannot register the Unix socket: {e}"))
}

#[cfg(not(target_os = "linux"))]
async fn connect_unix(_: usize, _: &str) -> Result<UnixStream, String> {
    Err("Unix sockets for local peers are only used on Linux".into())
}

/// A peer's published address.
pub(super) struct PeerAddr {
    pub(super) tcp: SocketAddr,
    /// (host id, abstract socket name)
    pub(super) unix: Option<(String, String)>,
    /// The peer offers shared memory (its broadcast segment exists).
    pub(super) shm: bool,
}

pub(super) fn parse_addr(peer: usize, raw: &[u8]) -> Result<PeerAddr, String> {
    let text = String::from_utf8_lossy(raw).to_string();
    let bad = || {
        format!("rank {peer}'s address in the store is not 'ip:port [unix=host/name]': '{text}'")
    };
    let mut parts = text.split_whitespace();
    let tcp: SocketAddr = parts.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
    let mut unix = None;
    let mut shm = false;
    for part in parts {
        if part == "shm" {
            shm = true;
            continue;
        }
        let (host, name) = part
            .strip_prefix("unix=")
            .and_then(|u| u.split_once('/'))
            .ok_or_else(bad)?;
        unix = Some((host.to_string(), name.to_string()));
    }
    Ok(PeerAddr { tcp, unix, shm })
}

/// What dialling a peer gave.
#[derive(Debug)]
pub(super) enum Dialled {
    /// The pair's connection.
    Conn(Conn),
    /// The peer refused it: it dials this rank itself (see [`HELLO_DUP`]).
    Dup,
}

/// Connects to `peer`: through its Unix socket if it is on this host, else
/// (or if that fails) through TCP.
async fn connect_one(
    me: &Me,
    peer: usize,
    addr: &PeerAddr,
    host: Option<&str>,
    deadline: Instant,
) -> Result<Dialled, SetupError> {
    // What the store says; the peer reads the same about this rank.
    let same_host = matches!((&addr.unix, host), (Some((h, _)), Some(me)) if h == me);
    if let (Some((their_host, name)), Some(host)) = (&addr.unix, host) {
        if their_host == host {
            match connect_unix(peer, name).await {
                Ok(mut s) => {
                    // A failed handshake is final: the peer is there but
                    // disagrees.
                    let h = handshake(me, peer, &mut s, &format!("unix:{name}"), same_host).await?;
                    if h.flags & HELLO_DUP != 0 {
                        return Ok(Dialled::Dup);
                    }
                    let shm = if me.pair_shm(&h) {
                        shm::exchange(&mut s, peer, me.opts.chunk_bytes, me.bcast.as_deref())
                            .await
                            .map_err(SetupError::Gone)?
                    } else {
                        shm::Pair::default()
                    };
                    return Ok(Dialled::Conn(Conn {
                        stream: Stream::Unix(s),
                        shm,
                    }));
                }
                Err(e) => {
                    tracing::debug!(peer, error = %e, "Unix socket connect failed; using TCP")
                }
            }
        }
    }
    let (s, h) = connect_tcp(me, peer, addr.tcp, deadline, same_host).await?;
    if h.flags & HELLO_DUP != 0 {
        return Ok(Dialled::Dup);
    }
    Ok(Dialled::Conn(Conn::plain(Stream::Tcp(s))))
}

/// Reads `peer`'s published address from the store (waiting for it until
/// `deadline`).
///
/// # Errors
///
/// [`SetupError::Store`] if the store fails or the address does not appear
/// in time; [`SetupError::Other`] if it cannot be parsed.
pub(super) async fn peer_addr(
    store: &dyn Store,
    peer: usize,
    deadline: Instant,
) -> Result<PeerAddr, SetupError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let raw = store
        .get(&format!("addr/{peer}"), left)
        .await
        .map_err(SetupError::Store)?;
    Ok(parse_addr(peer, &raw)?)
}

/// Dials `peer`: reads its address from the store and connects, all by
/// `deadline`.
///
/// # Errors
///
/// [`SetupError::Store`] if the store fails or the address does not
/// appear in time, else what failed.
pub(super) async fn dial(
    me: &Me,
    store: &dyn Store,
    host: Option<&str>,
    peer: usize,
    deadline: Instant,
) -> Result<Dialled, SetupError> {
    let addr = peer_addr(store, peer, deadline).await?;
    let timeout = me.opts.connect_timeout;
    let d = tokio::time::timeout_at(
        deadline.into(),
        connect_one(me, peer, &addr, host, deadline),
    )
    .await
    .map_err(|_| {
        format!(
            "connecting to rank {peer} at {} timed out (TcpOptions::connect_timeout is {timeout:?})",
            addr.tcp
        )
    })??;
    Ok(d)
}

fn listener(ip: std::net::IpAddr) -> Result<TcpListener, String> {
    let sock = if ip.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| format!("cannot create a socket: {e}"))?;
    sock.bind(SocketAddr::new(ip, 0)).map_err(|e| {
        format!("cannot bind a listener on {ip}: {e} (is advertise_ip an address of this host?)")
    })?;
    sock.listen(1024)
        .map_err(|e| format!("cannot listen on {ip}: {e}"))
}

/// Why setup failed.
#[derive(Debug)]
pub(super) enum SetupError {
    /// The store failed while addresses were exchanged (becomes
    /// `Error::Store`).
    Store(StoreError),
    /// The peer published its address but no longer accepts connections
    /// there: it is gone.
    Gone(String),
    /// Anything else: what failed and what to check (becomes
    /// `Error::Setup`).
    Other(String),
}

impl From<String> for SetupError {
    fn from(msg: String) -> Self {
        SetupError::Other(msg)
    }
}

/// This rank's listeners, as published in the store.
#[derive(Debug)]
pub(super) struct Listening {
    pub(super) tcp: TcpListener,
    pub(super) unix: Option<UnixListener>,
    /// This host's id, where local peers are reached through Unix sockets.
    pub(super) host: Option<String>,
    /// Who this rank is, with its broadcast segment if it has one.
    pub(super) me: Me,
}

/// Binds this rank's listeners, creates its broadcast segment and
/// publishes `addr/{rank}`: no connection is made.
///
/// # Errors
///
/// [`SetupError::Store`] if the store fails, else what failed and what to
/// check.
pub(super) async fn listen(store: &dyn Store, mut me: Me) -> Result<Listening, SetupError> {
    let lst = listener(me.opts.advertise_ip)?;
    let local = lst
        .local_addr()
        .map_err(|e| format!("cannot read the listener's address: {e}"))?;
    let addr = SocketAddr::new(me.opts.advertise_ip, local.port());
    let host = if me.opts.local_unix_sockets {
        host_id()
    } else {
        None
    };
    let mut ulst = None;
    let mut published = addr.to_string();
    if let Some(h) = &host {
        match unix_listener(&me) {
            Ok((l, name)) => {
                published = format!("{published} unix={h}/{name}");
                ulst = Some(l);
            }
            Err(e) => tracing::debug!(error = %e, "no Unix socket for local peers; using TCP"),
        }
    }
    if ulst.is_some() && me.wants_shm() {
        match shm::Bcast::create(me.opts.chunk_bytes) {
            Ok(b) => {
                me.bcast = Some(Arc::new(b));
                published.push_str(" shm");
            }
            Err(e) => {
                tracing::info!(error = %e, "no shared-memory broadcast segment; this rank uses the ring")
            }
        }
    }
    let host = host.filter(|_| ulst.is_some());
    store
        .set(&format!("addr/{}", me.rank), published.as_bytes())
        .await
        .map_err(SetupError::Store)?;
    tracing::debug!(group = %me.group, rank = me.rank, %addr, "listening for peers");
    Ok(Listening {
        tcp: lst,
        unix: ulst,
        host,
        me,
    })
}
