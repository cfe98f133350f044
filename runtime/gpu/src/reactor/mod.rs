//! The completion reactor: completes in-flight GPU ops when they finish and
//! wakes the futures awaiting them (docs/ARCHITECTURE.md, rule 2 and
//! "Waking on time").
//!
//! A backend hands the reactor one [`Pending`] entry per op it cannot
//! complete itself: typically the op's end event together with its
//! completer and buffers. The NCCL backend does so when a work's poll finds
//! the op still running ([`Reactor::register`]); an op that a poll finds
//! finished never reaches the reactor, and ops nobody waits for any more
//! are retired by the threads that let go of them, with a slow sweeper
//! here for the last ones ([`Reactor::register_detached`]). An entry that
//! finds its event complete (or failed) in [`Pending::poll_complete`]
//! completes its work, which wakes the future awaiting it.
//!
//! # Driver waiters
//!
//! An awaited op is watched by a thread that sleeps in the driver until
//! its end event completes (`waiters`): entries with a
//! [`Pending::sleeper`] and an [`order`](Pending::order) go to their
//! stream's waiter, which sleeps on the stream's earliest pending entry
//! and completes what ended when the GPU wakes it. It costs no CPU while
//! the op runs and sees the end when the driver does, however long the op
//! ran and whatever ran before it.
//!
//! # The reactor thread and the pre-wake
//!
//! A thread parked for a millisecond takes tens to hundreds of
//! microseconds to run again once woken, whoever wakes it. So an op whose
//! end is expected (its [`Pending::expected_end`], learned from ops like
//! it, given only where they ended alike) also has an entry on the
//! reactor thread that wakes its future `prewake_lead` (default 500 µs)
//! before that end ([`Pending::prewake`]): the future then watches the end
//! event itself and sees it within microseconds. The thread sleeps until
//! the first pre-wake; registering such an op does not wake it, but brings
//! its sleep forward to the op's pre-wake if it would end later (it sleeps
//! on a timer others can re-arm, `crate::bell`). The driver waiter
//! completes the op all the same if it ends before its pre-wake, or after
//! the woken future stopped watching.
//!
//! The thread also polls entries that cannot be slept on (no sleeper or
//! no order): it spins (`spin`, default 50 µs since the last progress),
//! may yield its core between rounds (until `yield_for`, default: no
//! yielding), then sleeps between rounds for an eighth of how long the
//! ops have been running (10 µs up to `max_sleep`, default 1 ms, with the
//! thread's timer slack at 1 µs). Any progress (a completion, a new
//! registration, a [`Reactor::nudge`]) starts the spin phase again. With
//! nothing to watch it spins the same way and yields for at most 1 ms,
//! then parks and uses no CPU until the next registration unparks it — at
//! once when the op that just completed had it sleeping.
//!
//! The settings ([`ReactorConfig`]) come from [`configure`], or from the
//! `CHORUS_REACTOR_*` variables (see `crate::config`).
//!
//! # Detached entries
//!
//! Some entries need watching, but not quickly: the sweeper of an NCCL
//! communicator's retire queue (ops nobody waits for any more: their work
//! was dropped, or their buffers were taken back stream-ordered), or a
//! dropped op of a grouped launch. They go in with
//! [`Reactor::register_detached`]: checked once every `detached_poll`
//! (default 50 µs), they never make the thread spin, and their registration
//! costs no wake-up unless the thread is parked. This keeps the reactor's
//! event queries (which contend with the enqueuing threads in the CUDA
//! driver) and its cache traffic off the enqueue path of a stream of ops
//! that nobody awaits one by one.
//!
//! # Safety of buffers
//!
//! An entry owns the op's buffers until it completes; neither the reactor
//! thread nor a driver waiter drops an entry before `poll_complete`
//! returned true. An entry whose
//! `poll_complete` panics is leaked (never dropped), so memory the GPU may
//! still touch is never freed.
//!
//! # Files
//!
//! * `pending`: [`Pending`], one watched op, and [`Sleeper`].
//! * `handle`: [`Reactor`], registering entries, its counters and its
//!   error.
//! * `process_wide`: the process-wide reactor ([`global`], [`configure`],
//!   [`stats`]).
//! * `shared`: the state registering threads, the reactor thread and the
//!   driver waiters share.
//! * `thread`: the reactor thread's loop.
//! * `waiters`: the driver waiters, one per stream;
//!   `waiter_queues`: their bookkeeping.

mod handle;
mod pending;
mod process_wide;
mod shared;
mod thread;
mod waiter_queues;
mod waiters;

pub use crate::config::ReactorConfig;
pub use handle::{Reactor, ReactorError, ReactorStats};
pub use pending::{Pending, Sleeper};
pub use process_wide::{configure, global, stats};

#[cfg(test)]
mod tests;
