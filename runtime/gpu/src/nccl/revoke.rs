//! Stopping an aborted communicator's work: `ncclCommAbort`, or, for a
//! communicator kept as the parent of a later `ncclCommShrink`:
//!
//! * `ncclCommRevoke` where the loaded NCCL has it (2.28.7): its in-flight
//!   operations stop at once and it stays, quiet, refusing ops, for a
//!   shrink with `NCCL_SHRINK_DEFAULT` — if its asynchronous state is
//!   success: one that failed (a peer's socket closed: `ncclRemoteError`)
//!   is aborted, since NCCL's shrink of it returns that error;
//! * else the handle is kept as it is, its work still waiting on the lost
//!   peer, for a shrink with `NCCL_SHRINK_ABORT`, which stops that work
//!   first (or for the abort at its drop).
//!
//! The calls run on a thread of their own (`chorus-nccl-abort`): the caller
//! of an abort (the watchdog, a timed-out wait) never waits for NCCL. A
//! blocking communicator's revoke returns once it is quiet; a non-blocking
//! one's reports `ncclInProgress` through `ncclCommGetAsyncError` until
//! then, which that thread polls with growing pauses, bounded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::sync::lock;
use nccl_sys::sys::{ncclComm_t, ncclResult_t, NCCL_REVOKE_DEFAULT};
use nccl_sys::Nccl;

/// A raw communicator handle owned by whoever holds this value.
#[derive(Debug)]
pub(super) struct RawComm(pub(super) ncclComm_t);

// SAFETY: the handle is owned by the holder alone; NCCL communicators may
// be used from any thread when calls on them are not concurrent (the
// holder makes one call at a time), and ncclCommAbort may be called
// concurrently with any other call.
unsafe impl Send for RawComm {}

/// A communicator kept for a shrink.
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) raw: RawComm,
    /// Revoked and quiet (shrink with `NCCL_SHRINK_DEFAULT`); else its work
    /// may still run (shrink with `NCCL_SHRINK_ABORT`).
    pub(super) quiet: bool,
}

/// Where a kept communicator waits for a shrink (or its drop).
pub(super) type RevokedSlot = Arc<Mutex<Option<Kept>>>;

/// How an aborted communicator is stopped.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stop {
    /// `ncclCommAbort`.
    Abort,
    /// Kept for a shrink: revoked with this call, or as it is (`None`).
    Keep(Option<nccl_sys::sys::ncclCommRevoke_t>),
}

/// How long a revoke may take before the communicator is aborted instead.
const REVOKE_LIMIT: Duration = Duration::from_secs(30);

/// Stops `comm` as `how` says, keeping it in `slot` for a shrink (an
/// abort when its revoke fails). Blocks until done: run it on a thread of
/// its own.
pub(super) fn stop(nccl: &'static Nccl, comm: RawComm, how: Stop, slot: &RevokedSlot, device: i32) {
    let keep = |raw: RawComm, quiet: bool| {
        *lock(slot) = Some(Kept { raw, quiet });
    };
    if let Stop::Keep(None) = how {
        tracing::info!(
            device,
            "NCCL communicator kept for a shrink (no ncclCommRevoke: its work stops at the shrink)"
        );
        keep(comm, false);
        return;
    }
    if let Stop::Keep(Some(revoke)) = how {
        let t0 = Instant::now();
        // SAFETY: `comm.0` is live and owned here (the communicator
        // swapped it out); revoke is documented for a communicator with
        // operations in flight.
        let rc = unsafe { revoke(comm.0, NCCL_REVOKE_DEFAULT) };
        let state = if rc.is_success() || rc.is_in_progress() {
            quiet(nccl, &comm)
        } else {
            Err(format!("ncclCommRevoke returned {rc}"))
        };
        match state {
            Ok(st) if st.is_success() => {
                tracing::info!(
                    device,
                    elapsed = ?t0.elapsed(),
                    "NCCL communicator revoked: its work stopped, kept as a parent for a shrink"
                );
                keep(comm, true);
                return;
            }
            // NCCL creates a child communicator only from a parent whose
            // asynchronous state is success: a shrink of this one would
            // return its error (a lost peer's `ncclRemoteError`, say).
            Ok(st) => {
                tracing::info!(
                    device,
                    elapsed = ?t0.elapsed(),
                    state = %st,
                    "NCCL communicator revoked with an asynchronous error, which a shrink \
                     would return; aborting it (the re-formed group creates its own)"
                );
            }
            Err(why) => {
                tracing::warn!(
                    device,
                    why,
                    "revoking the NCCL communicator failed; aborting it"
                );
            }
        }
    }
    // SAFETY: `comm.0` is live and owned here; ncclCommAbort may be called
    // while other threads are inside NCCL calls on it.
    unsafe { (nccl.ncclCommAbort)(comm.0) };
}

/// Polls a revoked communicator until it is no longer in progress (bounded
/// by [`REVOKE_LIMIT`]); its state then: success, or the error that made
/// it fail.
fn quiet(nccl: &Nccl, comm: &RawComm) -> Result<ncclResult_t, String> {
    let t0 = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        let mut st = ncclResult_t::ncclSuccess;
        // SAFETY: `comm.0` is live and owned by the caller.
        let rc = unsafe { (nccl.ncclCommGetAsyncError)(comm.0, &mut st) };
        if !rc.is_success() {
            return Err(format!("ncclCommGetAsyncError returned {rc}"));
        }
        if !st.is_in_progress() {
            return Ok(st);
        }
        if t0.elapsed() > REVOKE_LIMIT {
            return Err(format!("still in progress after {REVOKE_LIMIT:?}"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}
