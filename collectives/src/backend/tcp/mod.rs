//! The TCP backend: collectives over TCP connections (Unix sockets and
//! shared memory between ranks of one host), for machines without a GPU
//! (and for tests).
//!
//! # Setup and connections
//!
//! Setup connects to no one: every rank binds a listener on
//! [`TcpOptions::advertise_ip`] (and an abstract Unix socket) and publishes
//! `addr/{rank}` in the group's (already namespaced) store; an **acceptor**
//! task answers the connections peers dial (see `acceptor`). A peer is
//! connected when an op first sends to it or waits for it: the worker reads
//! the peer's address from the store and dials (see `dialer` and `connect`). So a rank
//! holds connections only to the peers its ops talk to: `O(log N)` for the
//! small collectives of groups above 8 ranks (none where they all share
//! this host: they run on the group's board, below), its two neighbours
//! for the ring.
//!
//! **Who connects.** Either rank of a pair may dial; a pair keeps exactly
//! one connection. When both dial at once, the connection dialled by the
//! lower rank is kept: the lower rank's acceptor answers the higher rank's
//! hello with a refusal (`HELLO_DUP`) while its own dial to that rank is
//! out or done, and the higher rank then waits for the lower rank's
//! connection; a higher rank's acceptor always takes a lower rank's
//! connection. Both decisions are made under one table's lock per rank
//! (see `links`), so no rank both dials and accepts the same peer.
//!
//! Both ends exchange a handshake (magic, protocol version, group name,
//! ranks, group size, chunk and crossover sizes) and check it, so ranks of
//! different groups or with different [`TcpOptions`] never talk.
//! `TCP_NODELAY` is set on every connection. A connection that cannot be
//! made fails the op that needed it, naming the peer: within
//! [`TcpOptions::connect_timeout`] when the peer does not answer or
//! disagrees in the handshake ([`WorkError::Backend`], with what to check),
//! at once with [`WorkError::PeerLost`] when the peer's published address
//! refuses or resets the connection (it was there, so it is gone), and
//! with the group's failure instead when a fault notice names one.
//!
//! # Execution
//!
//! * [`Backend::submit`] pushes the op to an unbounded queue and returns.
//! * One **worker task** per group runs ops strictly in submission order; it
//!   owns the write half of every connection, and takes each connection
//!   into use (opening it, or taking the one a peer opened) when an op
//!   first needs the peer.
//! * One **reader task** per connected peer, started as soon as the
//!   connection is made (whoever made it), reads frames as they arrive into per-peer
//!   queues (one for collectives, one for send/recv), so a send never waits
//!   for the receiver to reach the op: two ranks that both send first do not
//!   deadlock. Receive buffers come from a pool, so steady-state ops do not
//!   allocate per chunk. A large collective frame (≥ 32 KiB) that the
//!   worker is already waiting for is not copied through the pool: the
//!   reader hands the worker the connection's read side after the header,
//!   and the worker checks the header and reads the payload straight into
//!   the op's buffer (see `conn`).
//! * A **batch** ([`Backend::launch`], see `batch`) reaches the worker
//!   as one batch: its sends first, and runs of all_reduces with one dtype
//!   and reduction fused into one all_reduce.
//! * Everything runs on chorus's own runtime ([`chorus_store::rt`]), never
//!   on the caller's executor — except a small op, which the submitting
//!   and awaiting thread runs itself when it can (below).
//!
//! # Ops on the caller's thread
//!
//! Handing a small op from thread to thread costs more than the exchange
//! itself: each wake-up of a sleeping thread is about a loopback round
//! trip on a small VM. So the worker and the readers are relays
//! ([`chorus_core::relay`]) that a caller may poll in their host tasks'
//! stead (see `drive`):
//!
//! * an op of at most `crossover_bytes` that finds the worker waiting is
//!   started on the submitting thread (its first frames leave from there);
//! * the first poll (or `wait_timeout`) that finds such an op pending
//!   polls the readers and the worker itself — reading the sockets and
//!   pipes, reducing, completing — until no frame has moved for
//!   [`TcpOptions::caller_spin`] (100 µs by default), yielding the core
//!   between rounds where this host's ranks outnumber its cores;
//! * where they do, a large op is driven by its awaiting caller too, until
//!   no frame has moved for 2 ms: the I/O threads would share the same
//!   cores, and each hand-off to them can leave a core idle while a
//!   thread wakes (4 ranks on 2 cores, 16 MiB: 10–20 % faster;
//!   `benches/RESULTS.md`). Elsewhere large ops stay on the I/O threads,
//!   and the caller's thread stays free for its other tasks;
//! * then it parks, and the I/O threads finish whatever is left;
//! * a caller whose op is done leaves its pipes watched (`linger`): the
//!   peers' frames for the next op ring no doorbell and wake no I/O
//!   thread.
//!
//! The sockets are read and written with plain non-blocking calls from
//! whichever thread runs them, and registered with the I/O driver only for
//! what a task waits on there (`halves`): frames that a spinning caller
//! reads itself wake no other thread.
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
//! least one frame with each peer it talks to, even with zero elements. While
//! the worker waits on one peer it looks at every other connected peer's
//! frames as they arrive: one of the op in progress (same seq) that
//! describes another op fails the op at once (see `watching`), so a rank
//! does not wait on a peer that waits on someone else because they called
//! different ops. A
//! rank that waits for an op its peer never calls ends in
//! [`WorkError::OpTimeout`].
//!
//! # Failures
//!
//! Each op runs under its timeout. After a timeout, a mismatch or a broken
//! connection the connections are in an unknown state: the backend is marked
//! failed, the op in flight and every queued and later op fail with the same
//! cause (re-addressed with [`WorkError::for_op`]), and every connection is
//! closed, so that the peers fail promptly too. Before it closes, a failed
//! rank tells every connected peer why (a fault notice), so that each
//! fails with the cause rather than waiting on a rank that will never
//! send; a rank that found a mismatch also connects to the peers it never
//! talked to, to tell them (at most 2 s for all of them). Other faults
//! (a lost or silent peer, a timeout) are not dialled out: the peers find
//! them themselves, and dialling across a partition would hold the rank up
//! while its group re-forms. Each connected peer's reader task
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
//! ops that then need it fail with [`WorkError::PeerLeft`] (it left, it
//! did not die). A peer this rank never connected to is watched by the
//! group's store-based liveness, not by this backend.
//!
//! # Algorithms
//!
//! | op | below `crossover_bytes`, up to 8 ranks | below `crossover_bytes`, more ranks | from `crossover_bytes` |
//! |---|---|---|---|
//! | all_reduce | direct: every rank sends its buffer to every other rank and reduces in rank order | recursive doubling: `log2 p` pairwise exchanges among the largest power of two `p <= n` ranks, the other `n - p` folded in before and given the result after | pipelined ring: reduce-scatter, then all-gather |
//! | broadcast | direct from the root | binomial tree from the root | pipelined chain from the root |
//! | reduce | direct to the root; the root reduces in rank order | binomial tree to the root | as below |
//! | all_gather | direct | direct | pipelined ring |
//! | reduce_scatter | direct; each rank reduces its block in rank order | same | pipelined ring |
//! | all_to_all | direct pairwise | same | same |
//! | send / recv | one frame per chunk | same | same |
//! | barrier | an empty frame to and from every rank | dissemination: `ceil(log2 n)` rounds, an empty frame to the rank `2^k` ahead and from the rank `2^k` behind | as below |
//!
//! Up to 8 ranks one round to every rank is faster than `log2 n`
//! dependent rounds, and the connections it needs are few
//! (`choose::DIRECT_MAX_RANKS`, measured with `tcp_allreduce`).
//!
//! Everything larger than `chunk_bytes` goes in chunks (the doubling and
//! tree schedules run once per chunk). The size that picks the algorithm
//! is the op's buffer (all_reduce, broadcast, reduce) or the full
//! `size × count` buffer (all_gather, reduce_scatter); every rank makes
//! the same choice from the same arguments, and the header's algorithm
//! field turns a rank that chose otherwise into a mismatch. The schedules
//! (which peer, which block, when) are pure functions of rank, size and
//! root in `algo` (`doubling`, `tree`, `dissemination`, `choose`), tested
//! without sockets; `algo::exec`, `algo::run_direct` and `algo::run_logarithmic`
//! run them.
//!
//! Results are bit-identical on every rank: recursive doubling reduces
//! each pair with the lower rank's operand first, whichever rank computes
//! it, so partners hold the same bits after every step; the direct paths
//! reduce in rank order (the order of
//! [`reference_reduce`](crate::reduce::reference_reduce)); the ring reduces
//! each block once, on its owner, and then copies it around. Doubling,
//! trees and the ring reduce floats in another order than the rank-order
//! reference (close, not equal).
//! [`ReduceOp::Avg`](crate::ReduceOp::Avg) sums and divides once at the end.
//! The direct rooted ops also send an empty frame the other way
//! (broadcast: to the root; reduce: from the root), so ranks that disagree
//! on the root get a mismatch. A tree depends on the root, so ranks that disagree on it could each
//! wait on a parent that waits on someone else: the rooted ops first pass
//! an empty frame around the ring (to the next rank, from the previous
//! one), which does not. If any two ranks disagree, some neighbours do, and
//! the one that reads the other's header fails with the mismatch; its
//! fault notice stops the others.
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
//! [`TcpOptions::local_unix_sockets`] is on (the default, Linux only):
//! they skip the kernel's TCP stack, and move several times the bytes of
//! a loopback TCP stream. Framing, checks and algorithms are the same on
//! both.
//!
//! ## Shared memory
//!
//! Between two ranks joined by a Unix socket that both have
//! [`TcpOptions::shared_memory`] on (the default; `CHORUS_SHM=0` turns it
//! off), the frames skip the socket (see `shm` and `pipe_io` for the
//! details):
//!
//! * **Segments.** When the pair's connection is made, each rank of the
//!   pair creates one segment for its direction: an anonymous, sealed `memfd` whose descriptor goes to
//!   the peer over the Unix socket (`SCM_RIGHTS`); the peer maps it and
//!   acknowledges. Nothing is ever created in `/dev/shm` or elsewhere in
//!   the file system, so there is nothing to unlink and nothing can leak,
//!   even if a rank is SIGKILLed: the memory goes away with the last
//!   mapping. A segment is a header page, a 1 MiB pipe and
//!   `min(32, 8 MiB / chunk)` slots (at least 2) of `chunk_bytes` each:
//!   with the default 256 KiB chunks, 32 slots (pages are only allocated
//!   once used; the lowest free slot is taken first). Shared memory is
//!   only offered when `chunk_bytes` is between 16 KiB and 16 MiB. Each
//!   rank's broadcast segment (below) is created at setup, once, and
//!   mapped by a local peer when their connection is made.
//! * **Pipes.** The frames of a direction go through the pipe of its
//!   segment, a ring of bytes with one writer and one reader
//!   (`chorus_core::pipe`): the same byte stream the socket would carry,
//!   framed and checked alike, but a frame costs no system call while
//!   both ranks run. The socket is left the control plane: a byte on it is
//!   a doorbell (the reader said it sleeps, and the writer published), its
//!   end is the peer's end (a fault notice or goodbye in the pipe before
//!   it says why).
//! * **Slots.** A frame whose payload is at least 16 KiB goes into a free
//!   slot; only its header (with the slot number) goes through the pipe,
//!   in order with every other frame. The receiver checks the header as
//!   always (mismatches are reported the same way), then reduces or copies
//!   straight from the slot into the op's buffer and frees the slot (its
//!   share of it, for a broadcast slot); the ring's reduce-scatter reduces
//!   a received partial sum straight into a slot of the next rank. Peers on
//!   other hosts and peers without a segment use the socket.
//! * **Broadcast segments.** Each rank also creates one segment of the
//!   same layout that every local peer maps, read by several peers (a
//!   slot's state counts its readers). When every rank of the group is on
//!   this host and offers shared memory (each rank publishes `shm` beside
//!   its Unix socket; at its first large all_reduce a rank reads every
//!   rank's published address, so every rank comes to the same answer;
//!   only groups of at most 16 ranks look, as this path talks to every
//!   rank) and there are at least 3 ranks, a large
//!   all_reduce runs the ring's reduce-scatter and then, instead of the
//!   ring's all-gather (which copies every block into a slot at every
//!   hop), each rank writes each chunk of its reduced block once into its
//!   broadcast segment and sends every peer only the header; each peer
//!   copies it out (algorithm `ALGO_RS_BCAST` in the header).
//! * **No new waits.** A sender that finds every slot of a peer in use
//!   sends that payload through the pipe instead of waiting for a slot,
//!   so the slots never block a sender and cannot deadlock the ring; a
//!   full pipe waits for the peer's reader task, which drains it into its
//!   queues whatever the peer's worker does, as a socket's buffer does.
//!   Timeouts, ordering and peer-death detection are the socket's,
//!   unchanged: a peer that dies leaves its slots full and its socket
//!   closed (`PeerLost`).
//! * **Agreement.** The handshake carries whether a rank offers shared
//!   memory; a pair uses it only if both ends do, and each direction only
//!   if its receiver mapped the segment. Failures to create or map a
//!   segment are logged (`tracing`, info) and that direction uses the
//!   socket.
//!
//! What each saves is measured in `benches/RESULTS.md` ("TCP backend").
//!
//! ## The group's board
//!
//! In a group of more than 8 ranks that all share this host (and each has
//! `shared_memory` and `local_unix_sockets` on), the small all_reduce,
//! reduce, broadcast and barrier (up to 4 KiB a rank, below
//! `crossover_bytes`) run on one board in shared memory for the whole
//! group: each rank writes its part once with the op's signature and
//! arrives; the last arrival wakes the others through a futex, and each
//! reads what it needs (every rank's part, in rank order, for a
//! reduction). Every rank checks every rank's signature, so a mismatch
//! fails every rank. It is set up at the group's first collective
//! through the store (rank 0's memfd, opened by the others through
//! `/proc`; used only if every rank opened it), needs no connection, and
//! a rank whose process died before it arrived fails the op with
//! [`WorkError::PeerLost`] within about 0.2 s. See `board`, `shm_board`
//! and `algo::run_board`; docs/ARCHITECTURE.md, "The group's board".
//!
//! ## Crossover and chunk size
//!
//! `crossover_bytes` (64 KiB) is about where the ring overtakes the
//! small algorithms, with 4 ranks (direct) and with 16 (recursive
//! doubling): the direct path sends `n - 1` copies of the buffer,
//! recursive doubling `log2 n`, the ring about two. `chunk_bytes` (256 KiB) gave the best
//! 16 MiB bandwidth for 2 and 4 ranks: smaller chunks cost more system
//! calls and wake-ups, larger ones more cache misses. Both were measured
//! with `tcp_allreduce` (`benches/README.md`); the figures are in
//! `benches/RESULTS.md`.
//!
//! # Files
//!
//! `options` ([`TcpOptions`]), `wire` (the handshake and the header of every
//! frame), `setup` (listening, publishing, dialling and answering a
//! handshake), `links` (who connects: the table of a rank's connections),
//! `acceptor` (answering peers' connections), `dialer` and `connect`
//! (connections on first use), `install` (a new connection's reader and write side), `notice`
//! (the fault notice a failing rank sends its peers), `pool`
//! (recycled receive buffers), `shm` (the shared-memory data plane: slots
//! and pipes), `halves` (a socket's two halves), `pipe_io` (a connection's
//! read and write sides over the socket or a shared-memory pipe), `board` and `shm_board` (the group's
//! shared-memory board: setting it up, its watcher thread; its mapping
//! and futex), `conn`
//! (the connections: readers and write
//! sides), `state` (what the handle, the worker and the readers share),
//! `request` (one op as the worker receives it), `watching` (looking at
//! every peer's frames while waiting on one), `algo` (the algorithms:
//! schedules and the code that runs them), `worker` (the per-group
//! worker), `drive` (a small op on the caller's thread), `linger` (pipes
//! left watched between a caller's small ops), `batch` (batches),
//! `backend` (`TcpBackend` through the backend interface).

mod acceptor;
mod algo;
mod backend;
mod batch;
mod board;
mod conn;
mod connect;
mod dialer;
mod drive;
mod halves;
mod install;
mod linger;
mod links;
mod notice;
mod options;
mod pipe_io;
mod pool;
mod request;
mod setup;
// With `shm_board`, the only modules of chorus with `unsafe`: shared
// memory between local ranks (memfd mappings, streaming copies out of
// it); see their module docs.
#[allow(unsafe_code)]
mod shm;
// The group board's mapping, futex and process look; see its module docs.
#[allow(unsafe_code)]
mod shm_board;
mod state;
mod watching;
mod wire;
mod worker;

#[cfg(test)]
mod tests;

pub(crate) use backend::{TcpBackend, TcpStaged};
pub use options::TcpOptions;
