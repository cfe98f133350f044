//! The NCCL backend: device buffers of a [`ProcessGroup`](crate::ProcessGroup)
//! go here, host vectors to the TCP backend (like c10d's
//! `"cpu:gloo,cuda:nccl"`).
//!
//! * **Communicator cache** (docs/ARCHITECTURE.md, "Communicators"): one
//!   `CommCache` per group. Key:
//!   `CommKey::devices([dev])` for collectives (this rank's device), the
//!   sorted rank pair for single point-to-point ops. Lazy, single-flight;
//!   the unique id goes through the group's store under the key the cache
//!   chooses (`comm/{n}` for collectives, `p2p/{lo}:{hi}` for pairs).
//! * **Non-blocking init**: `ncclCommInitRankConfig` with `blocking = 0`,
//!   awaited as a future on chorus's runtime that re-polls
//!   `ncclCommGetAsyncError` on a timer (no thread spins on it).
//! * **Subgroups** split from the parent's communicator (`ncclCommSplit`)
//!   when the parent has one; ranks outside take part with no colour.
//! * **Counting**: `NcclBackend::comms_created` and a `tracing` event
//!   (`target: "chorus::nccl"`, "creating NCCL communicator") per creation.
//! * **Errors**: the watchdog polls `ncclCommGetAsyncError` on every live
//!   communicator (`Backend::async_error`); abort marks every cached
//!   communicator aborted (it stays cached) and calls `ncclCommAbort`.
//! * **Batches** (`staged`): the device ops of a [`Batch`](crate::Batch) as
//!   one NCCL batch on the collective communicator.
//!
//! * **Faults**: NCCL's `ncclRemoteError` names no peer: the group's
//!   witness holds it back while the liveness task finds the peer whose
//!   beat stopped (`PeerLost` naming it). A re-form after lost ranks can
//!   shrink the revoked communicator (`carry`, [`ReformComms`]).
//!
//! Files, lowest first: `options` (the settings), `init` (creating
//! communicators), `backend` (the cache, lookups and the submission of one
//! op), `carry` (the communicator of a re-formed group), `staged`
//! (batches), `runs` (the backend interface).

mod backend;
mod carry;
mod init;
mod options;
mod runs;
mod staged;

pub(crate) use backend::{comm_error, device_check, lookup_error, NcclBackend};
pub(crate) use carry::{carry_over, Carried};
pub(crate) use init::split;
pub use init::NcclInitError;
pub use options::{NcclOptions, ReformComms};
pub(crate) use staged::NcclStaged;
