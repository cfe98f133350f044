//! [`Communicator::shrink`]: a communicator of the surviving ranks made
//! from a revoked one (`ncclCommShrink`, NCCL 2.27), without a new unique
//! id or a fresh bootstrap.

use std::os::raw::c_int;

use nccl_sys::sys::{ncclComm_t, ncclConfig_t, NCCL_SHRINK_ABORT, NCCL_SHRINK_DEFAULT};

use super::communicator::{CommOptions, Communicator};
use super::error::{nccl_err, NcclCommError};
use super::revoke::Kept;
use chorus_core::sync::lock;

impl Communicator {
    /// Whether this communicator can be shrunk: `Some(true)` once the
    /// loaded NCCL has `ncclCommShrink` and the communicator, aborted with
    /// [`CommOptions::keep_for_shrink`], is kept revoked and quiet (NCCL
    /// with `ncclCommRevoke`); `None` while its revoke still runs;
    /// `Some(false)` otherwise. A parent kept without a revoke, its work
    /// still waiting on the lost peer, is not offered: a shrink with
    /// `NCCL_SHRINK_ABORT` of such a parent fails with the lost peer's
    /// remote error on some survivors while others wait in it (NCCL 2.28.3,
    /// socket transport), and the survivors then need a fresh communicator
    /// anyway. Never blocks.
    pub fn revoked_parent(&self) -> Option<bool> {
        if self.nccl.ncclCommShrink.is_none() || !self.is_aborted() {
            return Some(false);
        }
        let mut done = lock(&self.abort_done);
        if let Some(rx) = done.as_ref() {
            match rx.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => return None,
                Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => *done = None,
            }
        }
        drop(done);
        Some(lock(&self.revoked).as_ref().is_some_and(|kept| kept.quiet))
    }

    /// The communicator of this one's ranks without `exclude` (ranks of
    /// this communicator), renumbered densely in their order
    /// (`ncclCommShrink` of the handle kept at the abort: with
    /// `NCCL_SHRINK_DEFAULT` once revoked, else `NCCL_SHRINK_ABORT`, which
    /// stops its work first). The new communicator is blocking: ops on it
    /// return once enqueued. The kept parent is aborted afterwards.
    ///
    /// Every surviving rank must call it with the same `exclude`. It blocks
    /// the calling thread until every one did: run it on a thread of its
    /// own, and call [`abort_revoked`](Self::abort_revoked) from another to
    /// give up.
    ///
    /// # Errors
    ///
    /// [`NcclCommError::Unavailable`] when the loaded NCCL has no
    /// `ncclCommShrink` or this communicator is not revoked (see
    /// [`revoked_parent`](Self::revoked_parent)); the NCCL or CUDA error
    /// otherwise.
    pub fn shrink(
        &self,
        exclude: &[usize],
        opts: CommOptions,
    ) -> Result<Communicator, NcclCommError> {
        let shrink = self.nccl.ncclCommShrink.ok_or_else(|| {
            NcclCommError::Unavailable(format!(
                "{} (NCCL {}) lacks ncclCommShrink (NCCL 2.27 or later)",
                self.nccl.path(),
                self.nccl.version()
            ))
        })?;
        let mut excl: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
        excl.sort_unstable();
        excl.dedup();
        if excl.iter().any(|&r| r < 0 || r as usize >= self.nranks)
            || excl.contains(&(self.rank() as c_int))
        {
            return Err(NcclCommError::InvalidArgument(format!(
                "cannot shrink rank {} of {} ranks without {exclude:?}",
                self.rank(),
                self.nranks
            )));
        }
        // The handle stays in its slot during the call, so that
        // `abort_revoked` can reach it from another thread.
        let (parent, flags): (ncclComm_t, _) = match &*lock(&self.revoked) {
            Some(Kept { raw, quiet }) => (
                raw.0,
                if *quiet {
                    NCCL_SHRINK_DEFAULT
                } else {
                    NCCL_SHRINK_ABORT
                },
            ),
            None => {
                return Err(NcclCommError::Unavailable(
                    "the communicator was not kept at its abort (or its revoke failed): \
                         create a fresh one"
                        .into(),
                ))
            }
        };
        self.device.bind_to_thread()?;
        let mut cfg = ncclConfig_t::initializer();
        cfg.blocking = 1;
        cfg.shrinkShare = 0;
        let mut out: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `parent` is the kept handle, which only this call uses (an `abort_revoked` from another thread may abort it,
        // which NCCL allows during a call); `excl`, `out` and `cfg` outlive
        // the blocking call, and NCCL copies the config.
        let rc = unsafe {
            shrink(
                parent,
                excl.as_mut_ptr(),
                excl.len() as c_int,
                &mut out,
                &mut cfg,
                flags,
            )
        };
        self.abort_revoked();
        if !rc.is_success() {
            if !out.is_null() {
                // SAFETY: a handle NCCL created that nobody else holds.
                unsafe { (self.nccl.ncclCommAbort)(out) };
            }
            return Err(nccl_err(self.nccl, "ncclCommShrink", rc));
        }
        if out.is_null() {
            return Err(NcclCommError::InvalidArgument(
                "ncclCommShrink returned no communicator".into(),
            ));
        }
        let below = excl.iter().filter(|&&r| (r as usize) < self.rank()).count();
        let (rank, nranks) = (self.rank() - below, self.nranks - excl.len());
        Communicator::wrap(self.nccl, out, &self.device, rank, nranks, opts).inspect_err(|_| {
            // SAFETY: `out` is the new handle nobody else holds.
            unsafe { (self.nccl.ncclCommAbort)(out) };
        })
    }

    /// Aborts the handle kept for a shrink, if any: ends a
    /// [`shrink`](Self::shrink) blocked on other ranks, or frees it once
    /// no shrink will come. Returns at once (the abort runs on a thread of
    /// its own).
    pub fn abort_revoked(&self) {
        let kept = lock(&self.revoked).take();
        if let Some(kept) = kept {
            let nccl = self.nccl;
            let run = move || {
                let kept: Kept = kept;
                // SAFETY: the handle was taken from the slot: exclusively
                // ours; ncclCommAbort may run during another call on it.
                unsafe { (nccl.ncclCommAbort)(kept.raw.0) };
            };
            if let Err(e) = std::thread::Builder::new()
                .name("chorus-nccl-abort".into())
                .spawn(run)
            {
                tracing::error!(error = %e, "cannot start the NCCL abort thread; the revoked communicator is leaked");
            }
        }
    }
}
