//! Creating communicators: the unique id, and [`PendingComm`], a
//! non-blocking init or split polled until it is ready.

use std::fmt;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_sys::sys::{ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SPLIT_NOCOLOR};
use nccl_sys::Nccl;

use super::communicator::{CommOptions, Communicator};
use super::error::{lib, nccl_err, NcclCommError};
use crate::cuda::Device;
use chorus_core::sync::lock;

/// A fresh NCCL unique id (what rank 0 of a communicator publishes).
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] without NCCL; the NCCL error otherwise.
pub fn unique_id() -> Result<[u8; 128], NcclCommError> {
    let nccl = lib()?;
    let mut id = ncclUniqueId::zeroed();
    // SAFETY: `id` is a valid, writable ncclUniqueId.
    let rc = unsafe { (nccl.ncclGetUniqueId)(&mut id) };
    if !rc.is_success() {
        return Err(nccl_err(nccl, "ncclGetUniqueId", rc));
    }
    Ok(id.to_bytes())
}

/// A communicator being created (non-blocking init or split): poll it until
/// it is ready. Dropping it unfinished aborts what was created.
pub struct PendingComm {
    nccl: &'static Nccl,
    /// Heap cell NCCL writes the new handle into (at a fixed address, as a
    /// non-blocking split writes it late).
    out: Box<ncclComm_t>,
    /// The parent of a split: its async error drives the split.
    parent: Option<Arc<Communicator>>,
    device: Device,
    nranks: usize,
    rank: usize,
    opts: CommOptions,
    started: Instant,
    done: bool,
}

// SAFETY: the raw handle in `out` is only an address NCCL writes once; NCCL
// communicators may be used from any thread (calls are serialized by the
// owner).
unsafe impl Send for PendingComm {}

impl fmt::Debug for PendingComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingComm")
            .field("device", &self.device.ordinal())
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("split", &self.parent.is_some())
            .finish()
    }
}

fn config() -> ncclConfig_t {
    let mut cfg = ncclConfig_t::initializer();
    cfg.blocking = 0;
    cfg
}

impl PendingComm {
    /// Starts `ncclCommInitRankConfig` (blocking = 0) for `rank` of `nranks`
    /// on `device` with the exchanged unique `id`.
    ///
    /// # Errors
    ///
    /// No NCCL or CUDA, bad ranks, or the NCCL error.
    pub fn init(
        device: &Device,
        nranks: usize,
        rank: usize,
        id: &[u8; 128],
        opts: CommOptions,
    ) -> Result<PendingComm, NcclCommError> {
        let nccl = lib()?;
        if rank >= nranks || nranks > c_int::MAX as usize {
            return Err(NcclCommError::InvalidArgument(format!(
                "rank {rank} is not in a communicator of {nranks} ranks"
            )));
        }
        let init = nccl.ncclCommInitRankConfig.ok_or_else(|| {
            NcclCommError::Unavailable(format!(
                "{} lacks ncclCommInitRankConfig (NCCL 2.14 or later is needed)",
                nccl.path()
            ))
        })?;
        device.bind_to_thread()?;
        let mut out = Box::new(std::ptr::null_mut());
        let mut cfg = config();
        let uid = ncclUniqueId::from_bytes(id);
        // SAFETY: `out` and `cfg` are valid for writes and outlive the call;
        // NCCL copies the config; `out` stays at its heap address until the
        // pending communicator is finished or dropped.
        let rc = unsafe { init(&mut *out, nranks as c_int, uid, rank as c_int, &mut cfg) };
        let mut p = PendingComm {
            nccl,
            out,
            parent: None,
            device: device.clone(),
            nranks,
            rank,
            opts,
            started: Instant::now(),
            done: false,
        };
        if !rc.is_success() && !rc.is_in_progress() {
            let e = nccl_err(nccl, "ncclCommInitRankConfig", rc);
            p.done = true;
            p.release();
            return Err(e);
        }
        Ok(p)
    }

    /// Starts a non-blocking `ncclCommSplit` of `parent`: `color` `None`
    /// takes part without joining (the result is then `None`).
    ///
    /// # Errors
    ///
    /// No split in this NCCL, an aborted parent, or the NCCL error.
    pub fn split(
        parent: &Arc<Communicator>,
        color: Option<u32>,
        key: usize,
        nranks: usize,
        rank: usize,
        opts: CommOptions,
    ) -> Result<PendingComm, NcclCommError> {
        let nccl = parent.nccl;
        let split = nccl.ncclCommSplit.ok_or_else(|| {
            NcclCommError::Unavailable(format!("{} lacks ncclCommSplit", nccl.path()))
        })?;
        let _g = lock(&parent.enqueue);
        let comm = parent.live()?;
        parent.device.bind_to_thread()?;
        let mut out = Box::new(std::ptr::null_mut());
        let mut cfg = config();
        let color = color.map_or(NCCL_SPLIT_NOCOLOR, |c| (c & 0x7fff_ffff) as c_int);
        // SAFETY: `comm` is a live communicator (we hold its enqueue lock);
        // `out` stays at its heap address until the split finishes (it is
        // written late, when polling the parent completes the job).
        let rc = unsafe { split(comm, color, key as c_int, &mut *out, &mut cfg) };
        if !rc.is_success() && !rc.is_in_progress() {
            return Err(nccl_err(nccl, "ncclCommSplit", rc));
        }
        Ok(PendingComm {
            nccl,
            out,
            parent: Some(parent.clone()),
            device: parent.device.clone(),
            nranks,
            rank,
            opts,
            started: Instant::now(),
            done: false,
        })
    }

    /// How long since the init or split started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Polls once (`ncclCommGetAsyncError`). `Ok(None)` while in progress;
    /// `Ok(Some(None))` for a split this rank did not join.
    ///
    /// # Errors
    ///
    /// The NCCL or CUDA error that ended the initialization.
    pub fn poll(&mut self) -> Result<Option<Option<Communicator>>, NcclCommError> {
        if self.done {
            return Err(NcclCommError::InvalidArgument(
                "the pending communicator was already finished".into(),
            ));
        }
        if let Some(parent) = &self.parent {
            // The split is a job of the parent.
            match parent.async_state() {
                Ok(true) => return Ok(None),
                Ok(false) => {}
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
            if self.out.is_null() {
                self.done = true;
                return Ok(Some(None));
            }
        }
        let comm = *self.out;
        if comm.is_null() {
            return Ok(None);
        }
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is the handle NCCL wrote; polling its async error is
        // allowed while its initialization runs.
        let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut state) };
        if !rc.is_success() {
            let e = nccl_err(self.nccl, "ncclCommGetAsyncError", rc);
            self.release();
            return Err(e);
        }
        if state.is_in_progress() {
            return Ok(None);
        }
        if !state.is_success() {
            let e = nccl_err(self.nccl, "ncclCommInitRankConfig", state);
            self.release();
            return Err(e);
        }
        self.done = true;
        match Communicator::wrap(
            self.nccl,
            comm,
            &self.device,
            self.rank,
            self.nranks,
            self.opts,
        ) {
            Ok(c) => {
                tracing::debug!(
                    device = self.device.ordinal(),
                    rank = self.rank,
                    nranks = self.nranks,
                    split = self.parent.is_some(),
                    "NCCL communicator ready"
                );
                Ok(Some(Some(c)))
            }
            Err(e) => {
                self.done = false;
                self.release();
                Err(e)
            }
        }
    }

    /// Aborts whatever NCCL created and marks this finished.
    fn release(&mut self) {
        self.done = true;
        let comm = std::mem::replace(&mut *self.out, std::ptr::null_mut());
        if !comm.is_null() {
            // SAFETY: `comm` is a handle NCCL created that nobody else owns.
            unsafe { (self.nccl.ncclCommAbort)(comm) };
        }
    }
}

impl Drop for PendingComm {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.parent.is_some() {
            // A split's handle may still be written by the parent's job:
            // leak the cell rather than let NCCL write into freed memory.
            let out = std::mem::replace(&mut self.out, Box::new(std::ptr::null_mut()));
            std::mem::forget(out);
            return;
        }
        self.release();
    }
}
