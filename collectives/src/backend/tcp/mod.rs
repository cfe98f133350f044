//! The TCP backend: collectives over a full mesh of TCP connections, for
//! machines without a GPU (and for tests).
//!
//! # Setup
//!
//! Every rank binds a listener on [`TcpOptions::advertise_ip`], publishes
//! `addr/{rank}` in the group's (already namespaced) store, reads the other
//! ranks' addresses and builds a full mesh: rank `i` connects to every rank
//! `j > i`. Both ends exchange a handshake (magic, protocol version, group
//! name, ranks, group size, chunk and crossover sizes) and check it, so
//! ranks of different groups or with different [`TcpOptions`] never talk.
//! `TCP_NODELAY` is set on every connection.
//!
//! # Execution
//!
//! * [`Backend::submit`] pushes the op to an unbounded queue and returns.
//! * One **worker task** per group runs ops strictly in submission order; it
//!   owns the write half of every connection.
//! * One **reader task** per peer reads frames as they arrive into per-peer
//!   queues (one for collectives, one for send/recv), so a send never waits
//!   for the receiver to reach the op: two ranks that both send first do not
//!   deadlock. Receive buffers come from a pool, so steady-state ops do not
//!   allocate per chunk. A large collective frame (≥ 32 KiB) that the
//!   worker is already waiting for is not copied through the pool: the
//!   reader hands the worker the connection's read side after the header,
//!   and the worker checks the header and reads the payload straight into
//!   the op's buffer (see `conn`).
//! * A **group** ([`Backend::submit_group`], see `group`) reaches the worker
//!   as one batch: its sends first, and runs of all_reduces with one dtype
//!   and reduction fused into one all_reduce.
//! * Everything runs on chorus's own runtime ([`chorus_store::rt`]), never
//!   on the caller's executor.
//!
//! # Checks
//!
//! Every frame carries a header (group hash, seq, op, dtype, reduce op, count,
//! root, algorithm, frame index, length; see `wire`) that the receiver checks
//! against what it expects before it touches the payload. Ranks that call
//! different collectives at the same seq get [`WorkError::Mismatch`] naming
//! both sides, e.g. `rank 1 at seq 7 called all_gather(count=10) but rank 0
//! called all_reduce(count=12)`. Frames are length-prefixed, so a mismatch
//! in message size is found the same way. Every collective exchanges at
//! least one frame with each peer it talks to, even with zero elements. A
//! rank that waits for an op its peer never calls ends in
//! [`WorkError::OpTimeout`].
//!
//! # Failures
//!
//! Each op runs under its timeout. After a timeout, a mismatch or a broken
//! connection the connections are in an unknown state: the backend is marked
//! failed, the op in flight and every queued and later op fail with the same
//! cause (re-addressed with [`WorkError::for_op`]), and every connection is
//! closed, so that the peers fail promptly too. Each peer's reader task
//! notices the end of its connection at once, whether or not an op is
//! waiting on it. If the peer left without a goodbye (its process died, or
//! its group failed or was aborted), the first op that needs a frame from it
//! that has not arrived fails at once with [`WorkError::PeerLost`] naming it,
//! and the group fails with that cause; frames that did arrive are still
//! used, so a rank that lags behind completes the ops its peers completed,
//! and a mismatching header is reported as a mismatch, not as the close that
//! followed. A rank that waits on a failed rank fails and closes in turn, so
//! a failure spreads through the group without waiting for timeouts; a rank
//! that is alive but stuck (SIGSTOP) makes the ranks waiting on it time out.
//! A peer whose backend was dropped after finishing its ops says goodbye;
//! ops that then need it fail with `PeerLost`.
//!
//! # Algorithms
//!
//! | op | below `crossover_bytes` | from `crossover_bytes` |
//! |---|---|---|
//! | all_reduce | direct: every rank sends its buffer to every other rank and reduces in rank order | pipelined ring: reduce-scatter, then all-gather |
//! | broadcast | direct from the root | pipelined chain from the root |
//! | reduce | direct to the root; the root reduces in rank order | same |
//! | all_gather | direct | pipelined ring |
//! | reduce_scatter | direct; each rank reduces its block in rank order | pipelined ring |
//! | all_to_all | direct pairwise | same |
//! | send / recv | one frame per chunk | same |
//! | barrier | an empty frame to and from every rank | same |
//!
//! Everything larger than `chunk_bytes` goes in chunks. The size that picks
//! the algorithm is the op's buffer (all_reduce, broadcast, reduce) or the
//! full `size × count` buffer (all_gather, reduce_scatter). Results are
//! bit-identical on every rank: the small paths reduce in rank order (the
//! order of [`reference_reduce`](crate::reduce::reference_reduce)), and the
//! ring reduces each block once, on its owner, and then copies it around.
//! [`ReduceOp::Avg`](crate::ReduceOp::Avg) sums and divides once at the end.
//! The rooted ops also send an empty frame the other way (broadcast: to the
//! root; reduce: from the root), so ranks that disagree on the root get a
//! mismatch rather than each completing on its own.
//!
//! The ring's chunks are scheduled as a wavefront: at time `t` a rank sends
//! chunk `t - s` of step `s` for every step, so a chunk received at one step
//! goes out at the next while it is still in cache, and all steps stream at
//! once.
//!
//! # Transports
//!
//! Peers on other hosts are reached through TCP (`TCP_NODELAY`, kernel
//! buffer autotuning). Peers on the same host and network namespace are
//! reached through abstract Unix domain sockets with 4 MiB buffers when
//! [`TcpOptions::local_unix_sockets`] is on (the default, Linux only): on
//! the 2-core development VM loopback TCP moves under 1 GB/s per stream,
//! Unix sockets about 7 GB/s. Framing, checks and algorithms are the same on
//! both.
//!
//! ## Shared memory
//!
//! Between two ranks joined by a Unix socket that both have
//! [`TcpOptions::shared_memory`] on (the default; `CHORUS_SHM=0` turns it
//! off), large payloads skip the socket (see `shm` for the details):
//!
//! * **Segments.** At setup each rank of the pair creates one segment for
//!   its direction: an anonymous, sealed `memfd` whose descriptor goes to
//!   the peer over the Unix socket (`SCM_RIGHTS`); the peer maps it and
//!   acknowledges. Nothing is ever created in `/dev/shm` or elsewhere in
//!   the file system, so there is nothing to unlink and nothing can leak,
//!   even if a rank is SIGKILLed: the memory goes away with the last
//!   mapping. A segment is a header page and `min(32, 8 MiB / chunk)` slots
//!   (at least 2) of `chunk_bytes` each: with the default 256 KiB chunks,
//!   32 slots, 8 MiB per direction (pages are only allocated once used;
//!   the lowest free slot is taken first). Shared memory is only offered
//!   when `chunk_bytes` is between 16 KiB and 16 MiB.
//! * **Broadcast segments.** Each rank also creates one segment of the
//!   same layout that every local peer maps, read by several peers (a
//!   slot's state counts its readers). When every rank of the group is on
//!   this host and offers shared memory (each rank publishes `shm` beside
//!   its Unix socket; a rank learns it about higher ranks from the store
//!   and about lower ones from their hellos, which also say whether they
//!   found this rank's published host equal to theirs, so every rank comes
//!   to the same answer) and there are at least 3 ranks, a large all_reduce runs the ring's
//!   reduce-scatter and then, instead of the ring's all-gather (which
//!   copies every block into a slot at every hop), each rank writes each
//!   chunk of its reduced block once into its broadcast segment and sends
//!   every peer only the header; each peer copies it out (algorithm
//!   `ALGO_RS_BCAST` in the header).
//! * **Frames.** A frame whose payload is at least 16 KiB goes into a free
//!   slot; only its header (with the slot number) goes through the socket,
//!   in order with every other frame. The receiver checks the header as
//!   always (mismatches are reported the same way), then reduces or copies
//!   straight from the slot into the op's buffer and frees the slot (its
//!   share of it, for a broadcast slot); the ring's reduce-scatter reduces
//!   a received partial sum straight into a slot of the next rank. Smaller frames, peers on other hosts and peers
//!   without a segment use the socket.
//! * **No new waits.** A sender that finds every slot of a peer in use
//!   sends that payload through the socket instead of waiting, so shared
//!   memory never blocks a sender and cannot deadlock the ring; timeouts,
//!   ordering and peer-death detection are the socket's, unchanged. A peer
//!   that dies leaves its slots full; the survivor sees its socket close
//!   (`PeerLost`) as before.
//! * **Agreement.** The handshake carries whether a rank offers shared
//!   memory; a pair uses it only if both ends do, and each direction only
//!   if its receiver mapped the segment. Failures to create or map a
//!   segment are logged (`tracing`, info) and that direction uses the
//!   socket.
//!
//! On the 2-core development VM this takes the 4-rank 16 MiB all_reduce
//! from about 19-21 ms to 11-13 ms on a quiet machine (figures in
//! `benches/RESULTS.md`).
//!
//! ## Crossover and chunk size
//!
//! Measured with f32 all_reduce, all ranks in one process, on the 2-core
//! development VM (ignored tests `bench_crossover_sweep` and
//! `bench_chunk_sweep`; figures in `/work/notes/tcp.md`). With 2 ranks the
//! direct path and the ring cost the same from 64 KiB on (both move the
//! buffer once each way). With 4 ranks the direct path (which sends `n - 1`
//! copies of the buffer) is faster at 16 KiB (150 µs against 300 µs) but
//! the ring wins from 64 KiB (260 µs against 500 µs, 230 µs against 680 µs
//! at 128 KiB): the crossover is 64 KiB. Chunks of 256 KiB gave the best
//! 16 MiB bandwidth for 2 and 4 ranks (64 KiB: more syscalls and wake-ups;
//! 1 MiB: more cache misses).

mod algo;
mod conn;
mod group;
mod setup;
mod shm;
mod wire;
mod worker;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chorus_core::{OpContext, WorkError};
use chorus_store::Store;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

use crate::backend::{Backend, OpRequest};
use crate::error::Error;
use conn::{PeerState, Pool};

/// Settings of the TCP backend. Every rank of a group must use the same
/// `crossover_bytes` and `chunk_bytes` (checked when the group connects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    /// The address other ranks use to reach this rank; the listener binds to
    /// it (port chosen by the OS). Default `127.0.0.1`, which only works when
    /// every rank runs on this host.
    pub advertise_ip: IpAddr,
    /// Messages of at least this many bytes use the bandwidth-optimal
    /// algorithms (ring, pipelined chain); smaller ones the low-latency
    /// direct path. Default 64 KiB (measured; see the module docs).
    pub crossover_bytes: usize,
    /// Largest payload of one frame, in bytes: large messages are cut into
    /// chunks of this size and pipelined. At least 8. Default 256 KiB.
    pub chunk_bytes: usize,
    /// How long setup waits for the other ranks' addresses and connections.
    /// Default 60 s.
    pub connect_timeout: Duration,
    /// Reach peers on the same host (and network namespace) through Unix
    /// domain sockets instead of loopback TCP, which is several times faster
    /// (Linux only; elsewhere every peer uses TCP). Peers on other hosts, or
    /// whose Unix socket cannot be reached, use TCP. Default true.
    pub local_unix_sockets: bool,
    /// Move large payloads to peers on the same host through shared memory
    /// (Linux only; needs `local_unix_sockets`, which carries the control
    /// messages): see "Shared memory" in the module docs. Used for a pair
    /// of ranks only when both have it on; otherwise, or if setting it up
    /// fails, payloads go through the socket. Default true, unless the
    /// environment variable `CHORUS_SHM` is `0`.
    pub shared_memory: bool,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            advertise_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            crossover_bytes: 64 << 10,
            chunk_bytes: 256 << 10,
            connect_timeout: Duration::from_secs(60),
            local_unix_sockets: true,
            shared_memory: std::env::var("CHORUS_SHM").map_or(true, |v| v.trim() != "0"),
        }
    }
}

/// Largest accepted `chunk_bytes`.
const MAX_CHUNK: usize = 1 << 30;

/// State shared by the backend handle, its worker and its reader tasks.
struct Inner {
    rank: usize,
    size: usize,
    group: Arc<str>,
    group_hash: u32,
    opts: TcpOptions,
    pool: Arc<Pool>,
    /// The first failure; later ops fail with it.
    failed: Mutex<Option<WorkError>>,
    has_failed: AtomicBool,
    /// Set to true on failure or abort: stops the worker's current op.
    stop: watch::Sender<bool>,
    /// The first peer whose connection broke, and why. Frames that already
    /// arrived from it are still used (a rank that lags behind finishes the
    /// ops its peers completed before one of them failed, and a mismatch
    /// found in a received header is reported as such, not as the close
    /// that followed it); an op that needs more from it fails at once.
    lost: Mutex<Option<(usize, String)>>,
    peers: Mutex<Vec<PeerState>>,
    readers: Mutex<Vec<AbortHandle>>,
    /// Frames sent through shared memory.
    shm_frames: AtomicU64,
    /// Frames that could have gone through shared memory but found every
    /// slot in use (sent through the socket).
    shm_full: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpBackend")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("failed", &self.has_failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Inner {
    /// Context for failures that belong to no particular op (a peer lost
    /// between ops); re-addressed with `for_op` when an op fails with it.
    fn base_ctx(&self) -> OpContext {
        OpContext {
            rank: self.rank,
            group: self.group.clone(),
            seq: 0,
            op: "tcp",
        }
    }

    fn failure(&self) -> Option<WorkError> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Marks the backend failed with `cause` (the first cause wins) and stops
    /// the worker's current op.
    fn fail(&self, cause: &WorkError) {
        {
            let mut f = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            if f.is_none() {
                tracing::debug!(group = %self.group, rank = self.rank, error = %cause, "TCP backend failed");
                *f = Some(cause.clone());
            }
            self.has_failed.store(true, Ordering::Release);
        }
        self.stop.send_replace(true);
    }

    /// True while some peer's connection is open (no goodbye, not lost).
    fn any_peer_open(&self) -> bool {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .iter()
            .enumerate()
            .any(|(p, st)| p != self.rank && *st == PeerState::Open)
    }

    /// Called by a reader task when its connection ends.
    fn peer_ended(&self, peer: usize, end: PeerState) {
        {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = peers.get_mut(peer) {
                if *p == PeerState::Open {
                    *p = end.clone();
                }
            }
        }
        // The worker is not stopped here: frames this peer sent before its
        // connection ended are still queued and may be all the op in flight
        // needs (a peer that finished the op and exited). An op that needs
        // more from this peer finds its queue closed and fails at once with
        // `PeerLost`; ops that need nothing more from it may finish.
        if let PeerState::Lost(cause) = end {
            self.lost
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert((peer, cause));
        }
    }

    /// The group's failure once the worker was stopped: the recorded
    /// failure, else the lost peer (which becomes the failure).
    fn settle(&self) -> WorkError {
        if let Some(f) = self.failure() {
            return f;
        }
        let lost = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let e = match lost {
            Some((peer, cause)) => WorkError::PeerLost {
                ctx: self.base_ctx(),
                peer,
                cause,
            },
            None => WorkError::Aborted {
                ctx: self.base_ctx(),
                reason: "the TCP backend was stopped".into(),
            },
        };
        self.fail(&e);
        self.failure().unwrap_or(e)
    }

    fn peer_state(&self, peer: usize) -> PeerState {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(peer)
            .cloned()
            .unwrap_or(PeerState::Open)
    }

    /// The error for an op that needs `peer` after its connection ended.
    fn lost_error(&self, ctx: &OpContext, peer: usize) -> WorkError {
        let cause = match self.peer_state(peer) {
            PeerState::Departed => format!(
                "rank {peer} shut its group down (its backend was dropped) before taking part in this op"
            ),
            PeerState::Lost(c) => c,
            PeerState::Open => "the connection's queue closed".to_string(),
        };
        WorkError::PeerLost {
            ctx: ctx.clone(),
            peer,
            cause,
        }
    }

    fn stop_readers(&self) {
        for h in self
            .readers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            h.abort();
        }
    }
}

/// The TCP backend of one group. See the [module docs](self).
pub(crate) struct TcpBackend {
    inner: Arc<Inner>,
    tx: mpsc::UnboundedSender<OpRequest>,
    /// Set by [`Backend::close`]: the worker says goodbye and stops.
    close: watch::Sender<bool>,
    /// Set by the worker once it has stopped (after its goodbyes).
    done: watch::Receiver<bool>,
}

impl fmt::Debug for TcpBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl TcpBackend {
    /// Connects this rank to the other `size - 1` ranks of `group` through
    /// addresses exchanged in `store` (already namespaced for the group),
    /// and starts the group's worker and reader tasks on chorus's runtime.
    /// Callable from any executor.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad rank, size or options;
    /// [`Error::Store`] if the store fails or a peer's address does not
    /// appear within `connect_timeout`; [`Error::Setup`] if a connection or a
    /// handshake fails or times out.
    pub(crate) async fn connect(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        group: Arc<str>,
        opts: TcpOptions,
    ) -> Result<Arc<TcpBackend>, Error> {
        if size == 0 || rank >= size || size > u32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(format!(
                "TCP backend of group '{group}': rank {rank} is not in a group of size {size}"
            )));
        }
        if opts.chunk_bytes < 8 || opts.chunk_bytes > MAX_CHUNK {
            return Err(Error::InvalidArgument(format!(
                "TcpOptions::chunk_bytes is {}; it must be between 8 and {MAX_CHUNK}",
                opts.chunk_bytes
            )));
        }
        let setup_err = |msg: String| Error::Setup {
            group: group.to_string(),
            rank,
            msg,
        };
        let me = setup::Me {
            rank,
            size,
            group: group.clone(),
            opts: opts.clone(),
            bcast: None,
        };
        let mesh = chorus_store::rt::run(setup::mesh(store, me))
            .await
            .map_err(setup_err)?
            .map_err(|e| match e {
                setup::SetupError::Store(e) => Error::Store(e),
                setup::SetupError::Other(msg) => setup_err(msg),
            })?;
        let handle = chorus_store::rt::handle().map_err(setup_err)?;

        let (stop, stop_rx) = watch::channel(false);
        // Idle receive buffers kept for reuse: up to 32 MiB worth (the ring
        // reads ahead; fewer means an allocation and page faults per chunk).
        let pool_keep = (32 << 20) / opts.chunk_bytes + 8;
        let inner = Arc::new(Inner {
            rank,
            size,
            group_hash: wire::group_hash(&group),
            group,
            opts,
            pool: Pool::new(pool_keep),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            stop,
            lost: Mutex::new(None),
            peers: Mutex::new(vec![PeerState::Open; size]),
            readers: Mutex::new(Vec::new()),
            shm_frames: AtomicU64::new(0),
            shm_full: AtomicU64::new(0),
        });
        let mut writers = Vec::with_capacity(size);
        let mut shm_tx = Vec::with_capacity(size);
        let mut coll = Vec::with_capacity(size);
        let mut p2p = Vec::with_capacity(size);
        let mut readers = Vec::new();
        let mut shm_peers = 0;
        let mut bcast_ok = vec![false; size];
        for (peer, c) in mesh.conns.into_iter().enumerate() {
            let Some(c) = c else {
                writers.push(None);
                shm_tx.push(None);
                coll.push(None);
                p2p.push(None);
                continue;
            };
            let (rd, wr) = c.stream.split();
            shm_peers += usize::from(c.shm.tx.is_some());
            shm_tx.push(c.shm.tx);
            bcast_ok[peer] = c.shm.bcast_ok;
            let (ctx, crx) = mpsc::unbounded_channel();
            let (ptx, prx) = mpsc::unbounded_channel();
            let h = handle.spawn(conn::reader(
                peer,
                rd,
                ctx,
                ptx,
                c.shm.rx,
                c.shm.brx,
                inner.clone(),
            ));
            readers.push(h.abort_handle());
            writers.push(Some(conn::Writer::new(wr)));
            coll.push(Some(crx));
            p2p.push(Some(prx));
        }
        *inner.readers.lock().unwrap_or_else(PoisonError::into_inner) = readers;
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, close_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(false);
        let shm = worker::Shm {
            tx: shm_tx,
            bcast: mesh.bcast,
            bcast_ok,
            all_local: mesh.all_local,
        };
        let w = worker::Worker::new(inner.clone(), writers, shm, coll, p2p);
        handle.spawn(async move {
            w.run(rx, stop_rx, close_rx).await;
            done_tx.send_replace(true);
        });
        tracing::debug!(group = %inner.group, rank, size, shm_peers, all_local = mesh.all_local, "TCP backend connected");
        Ok(Arc::new(TcpBackend {
            inner,
            tx,
            close,
            done,
        }))
    }

    /// This rank.
    #[allow(dead_code)]
    pub(crate) fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The group's size.
    #[allow(dead_code)]
    pub(crate) fn size(&self) -> usize {
        self.inner.size
    }

    /// Frames sent through shared memory so far, and frames that would have
    /// been but found every slot in use.
    #[allow(dead_code)]
    pub(crate) fn shm_stats(&self) -> (u64, u64) {
        (
            self.inner.shm_frames.load(Ordering::Relaxed),
            self.inner.shm_full.load(Ordering::Relaxed),
        )
    }

    /// The options the backend was created with.
    #[allow(dead_code)]
    pub(crate) fn options(&self) -> &TcpOptions {
        &self.inner.opts
    }
}

impl Backend for TcpBackend {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn submit(&self, req: OpRequest) {
        if let Some(cause) = self.inner.failure() {
            let err = cause.for_op(req.ctx.clone());
            req.completer.complete(Err(err));
            return;
        }
        if let Err(mpsc::error::SendError(req)) = self.tx.send(req) {
            let err = match self.inner.failure() {
                Some(cause) => cause.for_op(req.ctx.clone()),
                None => WorkError::Backend {
                    ctx: req.ctx.clone(),
                    msg: "the TCP backend's worker has stopped".into(),
                },
            };
            req.completer.complete(Err(err));
        }
    }

    fn submit_group(&self, reqs: Vec<OpRequest>) {
        for r in group::fuse(reqs) {
            self.submit(r);
        }
    }

    fn close(&self) -> BoxFuture<'static, ()> {
        self.close.send_replace(true);
        let mut done = self.done.clone();
        Box::pin(async move {
            // The worker's goodbye and its wait for the peers' are bounded;
            // this bound only guards against a worker that cannot run.
            let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
        })
    }

    fn abort(&self, cause: &WorkError) {
        self.inner.fail(cause);
        // The worker closes the write halves and fails the queue when it sees
        // the stop signal; the readers stop now.
        self.inner.stop_readers();
    }
}
