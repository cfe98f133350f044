//! What can go wrong with an NCCL communicator or op, and where NCCL's own
//! result codes become that.

use std::time::Duration;

use nccl_sys::sys::ncclResult_t;
use nccl_sys::Nccl;

use crate::cuda::CudaError;

/// What went wrong with an NCCL communicator or op.
///
/// `Debug` shows the message (so `?` in `main` prints it); `{:#?}` the
/// structure.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NcclCommError {
    /// No usable NCCL library (the text says what was searched).
    #[error("NCCL unavailable: {0}")]
    Unavailable(String),
    /// A CUDA call failed (or there is no GPU).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// An NCCL call failed.
    #[error("{call} failed: {detail}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// Its result code.
        code: i32,
        /// NCCL's description and last error.
        detail: String,
    },
    /// The op's arguments do not fit the communicator.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The communicator was aborted; it is never used again.
    #[error("the NCCL communicator was aborted ({0}); create a new group to continue")]
    Aborted(String),
    /// The communicator's stream is being captured into a CUDA graph (by a
    /// [`GraphCapture`](super::graph::GraphCapture) on another stream): ops outside the capture
    /// are refused until the capture ends.
    #[error(
        "the NCCL communicator is being captured into a CUDA graph; ops outside the capture \
         are refused until the capture ends (finish or drop the capture first)"
    )]
    Capturing,
    /// A non-blocking NCCL call did not finish in time.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
}

chorus_core::debug_shows_message!(NcclCommError {
    Unavailable(reason),
    Cuda(e),
    Nccl { call, code, detail },
    InvalidArgument(msg),
    Aborted(reason),
    Capturing,
    Timeout { what, after },
});

impl NcclCommError {
    /// Whether this is NCCL's word for a peer that went away
    /// (`ncclRemoteError`, or a socket error: `ncclSystemError`), which
    /// never says which peer.
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, NcclCommError::Nccl { code, .. }
            if *code == ncclResult_t::ncclRemoteError.0 || *code == ncclResult_t::ncclSystemError.0)
    }
}

/// The NCCL library this process loads (found once, then cached): its
/// path and version, `(major, minor, patch)`.
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] naming what was searched when no usable
/// NCCL loads.
pub fn library() -> Result<(String, (u32, u32, u32)), NcclCommError> {
    let n = lib()?;
    let v = n.version();
    Ok((n.path().to_string(), (v.major, v.minor, v.patch)))
}

/// Makes the library at `path` the process's NCCL (the builder
/// equivalent of `CHORUS_NCCL_LIBRARY`; call it before the first NCCL op)
/// and returns what [`library`] returns.
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] when that library cannot be used, or the
/// process had already failed to load one.
pub fn use_library(path: &std::path::Path) -> Result<(String, (u32, u32, u32)), NcclCommError> {
    nccl_sys::use_library(path).map_err(|e| NcclCommError::Unavailable(e.to_string()))?;
    library()
}

/// The process's NCCL library.
pub(crate) fn lib() -> Result<&'static Nccl, NcclCommError> {
    nccl_sys::nccl().map_err(|e| NcclCommError::Unavailable(e.to_string()))
}

/// NCCL's result `code` of `call` as an error, with NCCL's description.
pub(crate) fn nccl_err(nccl: &Nccl, call: &'static str, code: ncclResult_t) -> NcclCommError {
    let detail = match nccl.check(code) {
        Err(e) => e.to_string(),
        Ok(()) => "success".into(),
    };
    NcclCommError::Nccl {
        call,
        code: code.0,
        detail,
    }
}
