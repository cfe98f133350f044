//! Building the full mesh: every rank listens, publishes its address in the
//! store, and rank `i` connects to every rank `j > i`. Both ends of a new
//! connection send a [`Hello`] and check the other's.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_runtime::store::Store;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::wire::{Hello, HELLO_FIXED};
use super::TcpOptions;

/// Who this rank is, for the handshake.
#[derive(Clone, Debug)]
pub(super) struct Me {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: Arc<str>,
    pub(super) opts: TcpOptions,
}

impl Me {
    fn hello(&self, to: usize) -> Hello {
        Hello {
            group: self.group.to_string(),
            from: self.rank as u32,
            to: to as u32,
            size: self.size as u32,
            crossover: self.opts.crossover_bytes as u64,
            chunk: self.opts.chunk_bytes as u64,
        }
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
        match from {
            Some(f) if f != peer => {
                return Err(format!(
                    "expected rank {f} at this address but rank {peer} answered (stale address in the store?)"
                ))
            }
            None if peer >= self.rank => {
                return Err(format!(
                    "rank {peer} connected to rank {}, but only lower ranks connect to higher ones",
                    self.rank
                ))
            }
            _ => {}
        }
        if h.crossover != self.opts.crossover_bytes as u64
            || h.chunk != self.opts.chunk_bytes as u64
        {
            return Err(format!(
                "rank {peer} uses crossover_bytes={} chunk_bytes={}, this rank uses {} and {}: every rank must use the same TcpOptions",
                h.crossover, h.chunk, self.opts.crossover_bytes, self.opts.chunk_bytes
            ));
        }
        Ok(peer)
    }
}

async fn read_hello(s: &mut TcpStream) -> Result<Hello, String> {
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

fn tune(s: &TcpStream) -> Result<(), String> {
    s.set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))
}

/// Why an incoming connection was refused; `fatal` when it came from a rank
/// of this very group (same name), whose settings disagree with ours: setup
/// fails at once instead of waiting for the timeout.
struct Refused {
    msg: String,
    fatal: bool,
}

/// Accepts one connection's handshake: reads the peer's hello, answers with
/// ours, checks theirs.
async fn accept_one(me: &Me, mut s: TcpStream) -> Result<(usize, TcpStream), Refused> {
    let stray = |msg: String| Refused { msg, fatal: false };
    tune(&s).map_err(stray)?;
    let h = read_hello(&mut s).await.map_err(stray)?;
    // Answer before checking, so that the peer sees our side and reports the
    // mismatch too.
    s.write_all(&me.hello(h.from as usize).encode())
        .await
        .map_err(|e| stray(format!("writing the handshake: {e}")))?;
    let peer = me.check(&h, None).map_err(|msg| Refused {
        msg,
        fatal: h.group == *me.group,
    })?;
    Ok((peer, s))
}

/// Connects to `peer` at `addr`, retrying refused connections until
/// `deadline`, and runs the handshake.
async fn connect_one(
    me: &Me,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream, String> {
    let mut backoff = Duration::from_millis(5);
    let mut s = loop {
        match TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if Instant::now() + backoff < deadline => {
                tracing::debug!(peer, %addr, error = %e, "connect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("cannot connect to rank {peer} at {addr}: {e}")),
        }
    };
    tune(&s)?;
    s.write_all(&me.hello(peer).encode())
        .await
        .map_err(|e| format!("writing the handshake to rank {peer}: {e}"))?;
    let h = read_hello(&mut s)
        .await
        .map_err(|e| format!("rank {peer} at {addr}: {e}"))?;
    me.check(&h, Some(peer))?;
    Ok(s)
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

/// Builds the mesh. Returns one stream per rank (`None` for this rank).
///
/// # Errors
///
/// What failed and what to check, as text for `Error::Setup`.
pub(super) async fn mesh(store: Arc<dyn Store>, me: Me) -> Result<Vec<Option<TcpStream>>, String> {
    let mut streams: Vec<Option<TcpStream>> = (0..me.size).map(|_| None).collect();
    if me.size == 1 {
        return Ok(streams);
    }
    let timeout = me.opts.connect_timeout;
    let deadline = Instant::now() + timeout;
    let lst = listener(me.opts.advertise_ip)?;
    let local = lst
        .local_addr()
        .map_err(|e| format!("cannot read the listener's address: {e}"))?;
    let addr = SocketAddr::new(me.opts.advertise_ip, local.port());
    store
        .set(&format!("addr/{}", me.rank), addr.to_string().as_bytes())
        .await
        .map_err(|e| format!("cannot publish this rank's address in the store: {e}"))?;
    tracing::debug!(group = %me.group, rank = me.rank, %addr, "listening for peers");

    // Accept from every lower rank.
    let me_ref = &me;
    let accept = async {
        let mut want: BTreeSet<usize> = (0..me.rank).collect();
        let mut got = Vec::new();
        let mut pending = FuturesUnordered::new();
        let mut last_err: Option<String> = None;
        while !want.is_empty() {
            tokio::select! {
                r = lst.accept() => match r {
                    Ok((s, from)) => pending.push(async move {
                        (from, tokio::time::timeout_at(deadline.into(), accept_one(me_ref, s)).await)
                    }),
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        last_err = Some(format!("accept failed: {e}"));
                    }
                },
                Some((from, r)) = pending.next(), if !pending.is_empty() => match r {
                    Ok(Ok((peer, s))) if want.remove(&peer) => got.push((peer, s)),
                    Ok(Ok((peer, _))) => {
                        let msg = format!("rank {peer} connected twice (from {from})");
                        tracing::warn!("{msg}");
                        last_err = Some(msg);
                    }
                    Ok(Err(Refused { msg, fatal: true })) => {
                        return Err(format!("refused a connection from {from}: {msg}"));
                    }
                    Ok(Err(Refused { msg, .. })) => {
                        tracing::warn!(%from, "rejected a connection: {msg}");
                        last_err = Some(format!("rejected a connection from {from}: {msg}"));
                    }
                    Err(_) => last_err = Some(format!("handshake from {from} timed out")),
                },
                () = tokio::time::sleep_until(deadline.into()) => {
                    return Err(format!(
                        "timed out after {timeout:?} waiting for ranks {want:?} to connect to {addr}{}; did every rank create the group with the same name, size and TcpOptions, and can they reach {addr} (set TcpOptions::advertise_ip)?",
                        last_err.map(|l| format!(" (last problem: {l})")).unwrap_or_default()
                    ));
                }
            }
        }
        Ok::<_, String>(got)
    };

    // Connect to every higher rank.
    let connect = async {
        let mut tasks = FuturesUnordered::new();
        for peer in me.rank + 1..me.size {
            let store = store.clone();
            let me = &me;
            tasks.push(async move {
                let left = deadline.saturating_duration_since(Instant::now());
                let raw = store
                    .get(&format!("addr/{peer}"), left)
                    .await
                    .map_err(|e| {
                        format!("cannot read rank {peer}'s address from the store: {e}")
                    })?;
                let text = String::from_utf8_lossy(&raw).to_string();
                let addr: SocketAddr = text.parse().map_err(|_| {
                    format!("rank {peer}'s address in the store is not ip:port: '{text}'")
                })?;
                let s =
                    tokio::time::timeout_at(deadline.into(), connect_one(me, peer, addr, deadline))
                        .await
                        .map_err(|_| {
                            format!(
                                "connecting to rank {peer} at {addr} timed out after {timeout:?}"
                            )
                        })??;
                Ok::<_, String>((peer, s))
            });
        }
        let mut got = Vec::new();
        while let Some(r) = tasks.next().await {
            got.push(r?);
        }
        Ok::<_, String>(got)
    };

    let (acc, con) = tokio::try_join!(accept, connect)?;
    for (peer, s) in acc.into_iter().chain(con) {
        streams[peer] = Some(s);
    }
    Ok(streams)
}
