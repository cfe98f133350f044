//! chorus-core: the part of chorus that decides, and does no I/O.
//!
//! Everything here is a state machine over memory: no sockets, no files, no
//! CUDA, no tokio. The layers above (`chorus-gpu`, `chorus-store`,
//! `chorus`) drive it and install hooks where it must reach out (a
//! registry's abort hook closes connections and writes the flight-recorder
//! dump). Its shared state is built on [`sync`] primitives that the
//! loom suite swaps for loom's, so the suite checks the code that runs.
//!
//! A map of the crate:
//!
//! * [`op`]: the op vocabulary every layer shares: [`DType`],
//!   [`ReduceOp`], [`Op`] and the shape rules of an op's buffers.
//! * [`element`]: [`Element`] types and type-erased [`HostBuffer`]s.
//! * [`work`]: [`OpFuture`], the future of one registered op, its
//!   [`Completer`], the completion slot, the per-group [`Registry`] of
//!   in-flight ops (abort, timeouts, the watchdog's view) and
//!   [`WorkBatch`], the works of ops launched as one, entered as one;
//!   [`Fanout`], one work awaited through several.
//! * [`calls`]: the requests of a pipelined client connection that await
//!   their replies, shared by the caller that reads its own reply and the
//!   driver on the I/O threads that watches the socket and the clock.
//! * [`board`]: the protocol of a group's board in shared memory, where
//!   every local rank writes its part of a small op once and reads
//!   everyone's: who may write which slot when, and who must wake whom.
//! * [`pipe`]: the protocol of a one-way byte pipe in shared memory
//!   between two processes (the TCP backend's pipes between local ranks):
//!   who may write which bytes when, and who must wake whom.
//! * [`relay`]: a future run by a host task on the I/O threads that a
//!   waiting caller may poll in its stead for a while (the TCP backend's
//!   worker and readers), with no lost wake-up and no double poll.
//! * [`linger`]: the hand-over between a caller that leaves pipe readers
//!   watched after its op and the worker that may need them woken.
//! * [`comm_cache`]: the per-group communicator cache with its
//!   in-initialization map (lazy single-flight init, store-key choice,
//!   abort), generic over the communicator.
//! * [`flight_recorder`]: the bounded ring of a group's last ops, the shape
//!   of a dump, and the divergence analysis behind `chorus-trace`.
//! * [`error`]: [`WorkError`], the typed error of an op, with the rank,
//!   group, sequence number and op ([`OpContext`]); [`Failed`], a failed
//!   op's error with its buffers.
//! * [`message_debug`]: `Debug` of the error types of every layer shows
//!   their message (`{:#?}` their structure), so `?` in `main` prints it;
//!   [`debug_shows_message!`] implements it for an enum.
//! * `profile`: per-phase timing of the enqueue path (feature `profile`):
//!   [`profile::Phase`], the phases a stamp ends.
//! * [`sync`]: std primitives, swapped for loom's under `cfg(loom)`;
//!   [`sync::lock`], the one way every crate of chorus locks a mutex.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// First: the files below use its macro by name.
#[macro_use]
pub mod message_debug;

pub mod board;
pub mod calls;
pub mod comm_cache;
pub mod element;
pub mod error;
pub mod flight_recorder;
pub mod linger;
pub mod op;
pub mod pipe;
pub mod profile;
pub mod relay;
pub mod sync;
pub mod work;

pub use element::{Element, HostBuffer, HostBuffers};
pub use error::{Failed, OpContext, WorkError};
pub use op::{DType, Op, ReduceOp};
pub use work::{
    Completer, EarlyWake, Fanout, FinishedProbe, OpFuture, Registry, WorkBatch, WorkStatus,
};
