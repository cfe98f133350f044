//! Loading a library: trying the candidates of a [`SearchPlan`] in order,
//! checking the version of each one that opens against [`MIN_VERSION`],
//! then resolving its symbols.

use std::ffi::{c_int, c_void};
use std::path::Path;

use crate::dynamic_linker::{file_of, open, OPEN_FLAGS};
use crate::error::{NcclLoadError, NcclVersion};
use crate::search::{Candidate, SearchPlan};
use crate::symbols::{lookup, Nccl};
use crate::sys::*;

/// The oldest NCCL chorus loads.
pub const MIN_VERSION: NcclVersion = NcclVersion::new(2, 18, 0);

/// `TooOld` when `version` predates [`MIN_VERSION`].
fn check_min_version(path: &str, version: NcclVersion) -> Result<(), NcclLoadError> {
    if version < MIN_VERSION {
        return Err(NcclLoadError::TooOld {
            path: path.to_owned(),
            found: version,
            minimum: MIN_VERSION,
        });
    }
    Ok(())
}

impl Nccl {
    /// Loads the library at `path` (a file path, or a bare name such as
    /// `"libnccl.so.2"` that the dynamic linker resolves). Meant for tests
    /// and tools; programs use [`nccl()`](crate::nccl()).
    ///
    /// # Errors
    ///
    /// As [`nccl()`](crate::nccl()); a file that cannot be opened is `BackendUnavailable`
    /// with this one path searched.
    pub fn load_from(path: impl AsRef<Path>) -> Result<Self, NcclLoadError> {
        let path = path.as_ref().to_string_lossy().into_owned();
        Self::load_with(&SearchPlan::new(vec![Candidate::Explicit(path)]))
    }

    /// Tries the candidates of `plan` in order and returns the first library
    /// that loads and is recent enough.
    ///
    /// # Errors
    ///
    /// When no candidate can be opened: `BackendUnavailable` listing all of
    /// them. When candidates opened but none was usable: the error of the
    /// first one (`TooOld`, `MissingSymbol` or `VersionQuery`).
    pub fn load_with(plan: &SearchPlan) -> Result<Self, NcclLoadError> {
        let mut searched = Vec::new();
        let mut reasons = Vec::new();
        let mut rejected: Option<NcclLoadError> = None;
        for candidate in &plan.candidates {
            searched.push(candidate.to_string());
            let opened = match candidate {
                Candidate::Explicit(p) => open(p, OPEN_FLAGS),
                Candidate::AlreadyLoaded(n) => open(n, OPEN_FLAGS | libc::RTLD_NOLOAD)
                    .map_err(|_| "not loaded in this process".to_owned()),
                Candidate::Name(n) => open(n, OPEN_FLAGS),
                Candidate::Path(p) => {
                    if !p.exists() {
                        continue;
                    }
                    match p.to_str() {
                        Some(s) => open(s, OPEN_FLAGS),
                        None => Err("path is not valid UTF-8".to_owned()),
                    }
                }
            };
            let lib = match opened {
                Ok(lib) => lib,
                Err(reason) => {
                    reasons.push(format!("{candidate}: {reason}"));
                    continue;
                }
            };
            match Self::from_library(lib, candidate) {
                Ok(nccl) => return Ok(nccl),
                Err(e) => {
                    reasons.push(format!("{candidate}: {e}"));
                    rejected.get_or_insert(e);
                }
            }
        }
        if let Some(e) = rejected {
            return Err(e);
        }
        searched.extend(plan.unmatched.iter().cloned());
        Err(NcclLoadError::BackendUnavailable { searched, reasons })
    }

    /// Checks the version of an opened library, then resolves its symbols.
    fn from_library(
        lib: libloading::Library,
        candidate: &Candidate,
    ) -> Result<Self, NcclLoadError> {
        let named = match candidate {
            Candidate::Explicit(s) | Candidate::AlreadyLoaded(s) | Candidate::Name(s) => s.clone(),
            Candidate::Path(p) => p.display().to_string(),
        };
        // SAFETY: `ncclGetVersion_t` is ncclGetVersion's signature in every
        // NCCL release.
        let get_version = unsafe { lookup::<ncclGetVersion_t>(&lib, "ncclGetVersion") };
        let Some(get_version) = get_version else {
            // Not NCCL at all (or not a usable one): report every missing
            // required symbol at once.
            return Err(NcclLoadError::MissingSymbol {
                path: named,
                missing: Self::missing_required(&lib),
            });
        };
        let path = file_of(get_version as *const c_void).unwrap_or(named);
        let mut code: c_int = 0;
        // SAFETY: `code` is a valid, writable int; ncclGetVersion only
        // writes the version code to it.
        let rc = unsafe { get_version(&mut code) };
        if !rc.is_success() {
            return Err(NcclLoadError::VersionQuery {
                path,
                detail: rc.to_string(),
            });
        }
        let Some(version) = NcclVersion::from_code(code) else {
            return Err(NcclLoadError::VersionQuery {
                path,
                detail: format!("nonsense version code {code}"),
            });
        };
        check_min_version(&path, version)?;
        Self::resolve(lib, path, version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_below_2_18_are_too_old() {
        let e = check_min_version("/lib/libnccl.so.2", NcclVersion::new(2, 17, 1)).unwrap_err();
        match &e {
            NcclLoadError::TooOld { found, minimum, .. } => {
                assert_eq!(*found, NcclVersion::new(2, 17, 1));
                assert_eq!(*minimum, NcclVersion::new(2, 18, 0));
            }
            other => panic!("expected TooOld, got {other:?}"),
        }
        assert!(e.to_string().contains("2.17.1") && e.to_string().contains("2.18.0"));
        // Old-style codes (2.8 and earlier) compare correctly too.
        let old = NcclVersion::from_code(2804).unwrap();
        assert!(check_min_version("x", old).is_err());
        assert!(check_min_version("x", NcclVersion::new(2, 18, 0)).is_ok());
        assert!(check_min_version("x", NcclVersion::new(2, 28, 3)).is_ok());
    }
}
