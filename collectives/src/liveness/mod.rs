//! Peer liveness through the store: a rank that stopped (SIGSTOP, a hung
//! host) or that a partition cut off is noticed within the liveness
//! timeout, however long the op in flight may run, on every backend
//! (docs/ARCHITECTURE.md, "Peer liveness" among the fault mechanisms).
//!
//! The TCP backend's transport sees a silent link by itself (keepalive);
//! NCCL cannot tell a slow peer from a dead one and spins until the op
//! timeout, and neither transport notices a peer process that is stopped
//! while its kernel still acknowledges. So every rank of a group also
//! keeps a beat in the group's store: a counter under `alive/{epoch}/{rank}`
//! that a task on chorus's runtime ([`chorus_store::rt`]) adds 1 to every
//! [`period`](beat::period) — independent of the user's threads and
//! executor, so a rank busy computing still beats. The same task watches
//! one peer, its predecessor on the ring of live ranks, and reads the
//! group's verdict log. [`Ring`](ring::Ring), the I/O-free part, turns
//! those readings into verdicts: a watched peer whose counter has not
//! moved for the liveness timeout is silent, and its watcher publishes
//! that in the log, for every rank to read, before it watches the next
//! live predecessor; a store that has not answered for as long means this
//! rank is cut off from the job.
//!
//! A verdict fails nothing while the group has no pending work (a peer
//! that comes back is alive again). With pending works, the group's error
//! policy is applied (by default the group is aborted, which aborts its
//! NCCL communicators) with
//! [`WorkError::PeerSilent`](chorus_core::WorkError::PeerSilent) naming the
//! peer, or [`WorkError::Store`](chorus_core::WorkError::Store) when the
//! store went silent.
//!
//! The same readings name the peer behind a failure that the backend
//! reports without naming it (NCCL's `ncclRemoteError`): the backend hands
//! it to the group's [`PeerWitness`], and the task fails the group with
//! [`WorkError::PeerLost`](chorus_core::WorkError::PeerLost) naming the
//! peer whose beat stopped or that left (see `witness`).
//!
//! Cost: two store requests per rank and round (one `add`, one `multi_get`
//! of the watched counters and the log's count), whatever the group's size;
//! one more per new log entry or verdict published; nothing on an op's
//! path. Off with a timeout of zero.
//!
//! Its files:
//!
//! * `beat`: the keys of a rank's counter and of the verdict log, the
//!   period of its beats, the default timeout.
//! * `ring`: [`Ring`](ring::Ring), whom a rank watches and what it
//!   concludes, with no I/O.
//! * `task`: the liveness task of a group, which beats, reads and fails the
//!   group.
//! * `marks`: the marks a counter carries besides its beats (a peer left,
//!   a peer found lost).
//! * `witness`: naming the peer behind a failure the backend reported
//!   without naming it.

mod beat;
mod marks;
mod ring;
mod task;
mod witness;

pub use beat::DEFAULT_PEER_LIVENESS;
pub(crate) use task::{Liveness, LivenessTask};
pub(crate) use witness::{PeerWitness, Report};

#[cfg(test)]
mod tests;
