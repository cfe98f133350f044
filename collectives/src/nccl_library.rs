//! Which NCCL library this process loads: [`nccl_library`],
//! [`use_nccl_library`].

use chorus_gpu::nccl::NcclCommError;

/// The NCCL library this process loads: its path and version
/// `(major, minor, patch)`.
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] naming what was searched when no usable
/// NCCL loads (set `CHORUS_NCCL_LIBRARY` to its path).
pub fn nccl_library() -> Result<(String, (u32, u32, u32)), NcclCommError> {
    chorus_gpu::nccl::library()
}

/// Makes the library at `path` this process's NCCL, as
/// `CHORUS_NCCL_LIBRARY` does; call it before the first device op.
/// Returns what [`nccl_library`] returns.
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] when that library cannot be used.
pub fn use_nccl_library(
    path: impl AsRef<std::path::Path>,
) -> Result<(String, (u32, u32, u32)), NcclCommError> {
    chorus_gpu::nccl::use_library(path.as_ref())
}
