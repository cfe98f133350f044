//! The process-wide NCCL: [`nccl()`], loaded once on first use, and
//! [`use_library`], which names the library before that first use.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::NcclLoadError;
use crate::search::{Candidate, SearchPlan};
use crate::symbols::Nccl;

/// The process-wide NCCL, found with [`SearchPlan::from_env`] on first use
/// and kept for the life of the process. Later calls return the same library
/// (or the same error) without searching again.
///
/// # Errors
///
/// [`NcclLoadError::BackendUnavailable`] when no library was found,
/// [`NcclLoadError::TooOld`] when the one found predates [`MIN_VERSION`](crate::MIN_VERSION),
/// [`NcclLoadError::MissingSymbol`] when it lacks required symbols.
pub fn nccl() -> Result<&'static Nccl, NcclLoadError> {
    NCCL.get_or_init(|| Nccl::load_with(&SearchPlan::from_env()))
        .as_ref()
        .map_err(Clone::clone)
}

static NCCL: OnceLock<Result<Nccl, NcclLoadError>> = OnceLock::new();

/// Makes the library at `path` the process-wide NCCL, as
/// `CHORUS_NCCL_LIBRARY` does (its builder equivalent): call it before the
/// first use of NCCL. Returns the process-wide library: the one at `path`,
/// or, if the process had already loaded one, that one.
///
/// # Errors
///
/// As [`nccl()`] for the library at `path`, or the earlier error if the
/// process had already failed to load one.
pub fn use_library(path: impl AsRef<Path>) -> Result<&'static Nccl, NcclLoadError> {
    let path = path.as_ref().to_string_lossy().into_owned();
    let plan = SearchPlan::new(vec![Candidate::Explicit(path)]);
    NCCL.get_or_init(|| Nccl::load_with(&plan))
        .as_ref()
        .map_err(Clone::clone)
}
