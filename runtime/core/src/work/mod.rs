//! The future of one registered op, and the backend's side of it.
//!
//! A backend creates an [`OpFuture`] and its [`Completer`] with
//! [`OpFuture::new`] when an op is submitted. The future goes to the caller
//! (wrapped in chorus's typed `Work`); the completer stays with the backend
//! together with the op's buffers, and hands the buffers back through the
//! future when the op is done.
//!
//! * **Owned buffers.** The output type `T` is the op's buffers. The backend
//!   owns them while the op runs; the future yields them when it is done.
//! * **Drop detaches.** Dropping (or leaking) a work does not cancel the op:
//!   the backend still holds the buffers and releases them once the op
//!   completes.
//! * **Cancellation is abort.** [`Registry::abort`] fails every pending work
//!   of the group with a clear error.
//! * **Executor-agnostic.** The future only stores a waker; it works under
//!   tokio, smol or `futures::executor::block_on`.
//!
//! Files: `slot` (the completion slot's state machine), `future`
//! ([`OpFuture`], [`Completer`]), `registry` ([`Registry`]), `batch`
//! ([`WorkBatch`]), `fanout` ([`Fanout`]).

mod batch;
mod fanout;
mod future;
mod registry;
mod slot;

pub use batch::WorkBatch;
pub use fanout::Fanout;
#[cfg(not(loom))]
pub use future::unpark_waker;
#[cfg(not(loom))]
pub use future::HOLD_GRACE;
pub use future::{Completer, EarlyWake, OpFuture};
pub use registry::{FinishedProbe, Registry};
pub use slot::WorkStatus;

#[cfg(all(test, not(loom)))]
mod tests;
