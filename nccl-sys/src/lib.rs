//! Raw NCCL bindings for chorus, loaded at run time.
//!
//! Nothing here links against NCCL: the crate builds and runs on machines
//! without it, and [`nccl()`] returns a typed [`NcclLoadError`] there. When a
//! library is found, its symbols are resolved one by one into [`Nccl`]:
//! required ones must all be present, optional ones are `Option`s.
//!
//! * [`sys`]: the C types (`ncclComm_t`, `ncclUniqueId`, `ncclResult_t`,
//!   `ncclConfig_t`, ...) and the function pointer types.
//! * [`Nccl`]: one loaded library with its resolved symbols; [`nccl()`] is
//!   the process-wide one, loaded once.
//! * [`SearchPlan`]: where the library is looked for, in order (see the
//!   [`search`] module).
//!
//! # Minimum version
//!
//! [`MIN_VERSION`] is **NCCL 2.18.0**, the first release with
//! `ncclCommSplit` and `splitShare`, which chorus's subgroups rely on (and
//! the NCCL that PyTorch 2.1 shipped). Every symbol chorus uses exists in
//! 2.18, so no supported NVIDIA release lacks one; the four that are
//! `Option`s (`ncclCommInitRankConfig`, `ncclCommSplit`, `ncclCommFinalize`,
//! `ncclGetLastError`) are those the layers above can do without (blocking
//! init, a fresh communicator instead of a split, destroy without finalize,
//! no extra error text), so a stripped or re-implemented libnccl (a shim, a
//! vendor port) still loads.
//!
//! NCCL's fault-tolerance calls of later releases are optional too, used
//! where the loaded library has them: `ncclCommShrink` (2.27),
//! `ncclCommRevoke` (2.28.7), `ncclCommGetUniqueId` and `ncclCommGrow`
//! (2.29). [`Nccl::missing_optional`] lists what a library lacks.
//!
//! No safe API lives here: calling a symbol is `unsafe` and the caller
//! upholds NCCL's contract. chorus-gpu builds the safe layer.
#![warn(missing_docs)]

mod error;
pub mod search;
pub mod sys;

use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

pub use error::{NcclError, NcclLoadError, NcclVersion};
pub use search::{Candidate, SearchPlan};
use sys::*;

/// The oldest NCCL chorus loads.
pub const MIN_VERSION: NcclVersion = NcclVersion::new(2, 18, 0);

macro_rules! nccl_symbols {
    (
        required { $($req:ident: $req_ty:ty,)* }
        optional { $($opt:ident: $opt_ty:ty,)* }
    ) => {
        /// One loaded NCCL library and its resolved symbols.
        ///
        /// Fields carry the C names. Required symbols are plain function
        /// pointers; optional ones are `None` when the library lacks them.
        ///
        /// The pointers are valid while this value lives (it holds the
        /// library open); the one returned by [`nccl()`] lives for the whole
        /// process. Calling any of them is `unsafe`: the caller upholds
        /// NCCL's documented contract for that function.
        #[allow(non_snake_case)]
        pub struct Nccl {
            _lib: libloading::Library,
            path: String,
            version: NcclVersion,
            $(
                #[doc = concat!("`", stringify!($req), "` (required).")]
                pub $req: $req_ty,
            )*
            $(
                #[doc = concat!("`", stringify!($opt), "` (optional).")]
                pub $opt: Option<$opt_ty>,
            )*
        }

        /// Symbols a library must export to be loaded.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($req)),*];
        /// Symbols that are used when present.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[$(stringify!($opt)),*];

        impl Nccl {
            /// Resolves every symbol of `lib`; fails listing the required
            /// ones that are missing.
            #[allow(non_snake_case)]
            fn resolve(
                lib: libloading::Library,
                path: String,
                version: NcclVersion,
            ) -> Result<Self, NcclLoadError> {
                $(
                    // SAFETY: `$req_ty` is the signature `nccl.h` declares
                    // for this symbol in every version >= MIN_VERSION.
                    let $req = unsafe { lookup::<$req_ty>(&lib, stringify!($req)) };
                )*
                let ($(Some($req),)*) = ($($req,)*) else {
                    let missing = Self::missing_required(&lib);
                    return Err(NcclLoadError::MissingSymbol { path, missing });
                };
                $(
                    // SAFETY: as above, `$opt_ty` is this symbol's signature
                    // in every version that exports it.
                    let $opt = unsafe { lookup::<$opt_ty>(&lib, stringify!($opt)) };
                )*
                Ok(Self { _lib: lib, path, version, $($req,)* $($opt,)* })
            }

            /// The required symbols `lib` does not export.
            fn missing_required(lib: &libloading::Library) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(
                    // SAFETY: only the presence of the symbol is tested; the
                    // pointer is dropped at once.
                    if unsafe { lib.get::<*const c_void>(stringify!($req).as_bytes()) }.is_err() {
                        missing.push(stringify!($req));
                    }
                )*
                missing
            }

            /// The optional symbols this library lacks.
            pub fn missing_optional(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(
                    if self.$opt.is_none() {
                        missing.push(stringify!($opt));
                    }
                )*
                missing
            }
        }
    };
}

nccl_symbols! {
    required {
        ncclGetVersion: ncclGetVersion_t,
        ncclGetUniqueId: ncclGetUniqueId_t,
        ncclCommInitRank: ncclCommInitRank_t,
        ncclCommAbort: ncclCommAbort_t,
        ncclCommDestroy: ncclCommDestroy_t,
        ncclCommGetAsyncError: ncclCommGetAsyncError_t,
        ncclGetErrorString: ncclGetErrorString_t,
        ncclCommUserRank: ncclCommUserRank_t,
        ncclCommCount: ncclCommCount_t,
        ncclCommCuDevice: ncclCommCuDevice_t,
        ncclGroupStart: ncclGroupStart_t,
        ncclGroupEnd: ncclGroupEnd_t,
        ncclAllReduce: ncclAllReduce_t,
        ncclBroadcast: ncclBroadcast_t,
        ncclReduce: ncclReduce_t,
        ncclAllGather: ncclAllGather_t,
        ncclReduceScatter: ncclReduceScatter_t,
        ncclSend: ncclSend_t,
        ncclRecv: ncclRecv_t,
    }
    optional {
        ncclCommInitRankConfig: ncclCommInitRankConfig_t,
        ncclCommSplit: ncclCommSplit_t,
        ncclCommFinalize: ncclCommFinalize_t,
        ncclGetLastError: ncclGetLastError_t,
        ncclCommShrink: ncclCommShrink_t,
        ncclCommRevoke: ncclCommRevoke_t,
        ncclCommGetUniqueId: ncclCommGetUniqueId_t,
        ncclCommGrow: ncclCommGrow_t,
    }
}

/// Looks `name` up in `lib` and copies the function pointer out.
///
/// # Safety
///
/// `T` must be the function pointer type matching the symbol's real C
/// signature; the pointer is only valid while `lib` stays loaded.
unsafe fn lookup<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: the caller guarantees `T` matches the symbol; a missing symbol
    // is an `Err`, never a null pointer cast to `T`.
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

/// The process-wide NCCL, found with [`SearchPlan::from_env`] on first use
/// and kept for the life of the process. Later calls return the same library
/// (or the same error) without searching again.
///
/// # Errors
///
/// [`NcclLoadError::BackendUnavailable`] when no library was found,
/// [`NcclLoadError::TooOld`] when the one found predates [`MIN_VERSION`],
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

/// `dlopen` flags for NCCL: resolve everything now (a broken library fails
/// here, not at the first collective) and keep its symbols private.
const OPEN_FLAGS: c_int = libc::RTLD_NOW | libc::RTLD_LOCAL;

/// Opens `name` (a path, or a bare name for the dynamic linker) with `flags`.
fn open(name: &str, flags: c_int) -> Result<libloading::Library, String> {
    // SAFETY: opening a shared library runs its initialisers. We only open
    // files that the user or the search plan names as NCCL; NCCL's
    // initialisers only set up internal state. With RTLD_NOLOAD nothing is
    // loaded at all.
    unsafe { libloading::os::unix::Library::open(Some(name), flags) }
        .map(libloading::Library::from)
        .map_err(|e| with_source(&e))
}

/// An error and its sources on one line (libloading puts dlerror's text in
/// the source).
fn with_source(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src.source();
    }
    s
}

/// The file a loaded symbol comes from, as the dynamic linker reports it.
fn file_of(symbol: *const c_void) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `symbol` is an address inside a loaded library and `info`
    // points to writable memory of the right size; dladdr only writes it.
    let found = unsafe { libc::dladdr(symbol, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic
    // linker, valid while the library is loaded (it is: we hold it open).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

impl Nccl {
    /// Loads the library at `path` (a file path, or a bare name such as
    /// `"libnccl.so.2"` that the dynamic linker resolves). Meant for tests
    /// and tools; programs use [`nccl()`].
    ///
    /// # Errors
    ///
    /// As [`nccl()`]; a file that cannot be opened is `BackendUnavailable`
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

    /// The file the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library's version (from `ncclGetVersion`).
    pub fn version(&self) -> NcclVersion {
        self.version
    }

    /// NCCL's description of a result code (`ncclGetErrorString`).
    pub fn error_string(&self, code: ncclResult_t) -> String {
        // SAFETY: ncclGetErrorString takes any code by value and returns a
        // pointer to a static string ("unknown result code" for codes it does
        // not know); it touches no other state.
        let text = unsafe { (self.ncclGetErrorString)(code) };
        if text.is_null() {
            return "no description".to_owned();
        }
        // SAFETY: non-null results point to static NUL-terminated strings
        // inside the library, which `self` keeps loaded.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// The last error NCCL recorded on this thread, in words
    /// (`ncclGetLastError`), or `None` when the library lacks the symbol or
    /// has nothing to say.
    pub fn last_error(&self) -> Option<String> {
        let get = self.ncclGetLastError?;
        // SAFETY: ncclGetLastError ignores its communicator argument (NCCL
        // documents that it may be NULL) and returns a pointer to a
        // thread-local or static NUL-terminated buffer.
        let text = unsafe { get(std::ptr::null_mut()) };
        if text.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, valid until the next NCCL call on
        // this thread; we copy it at once.
        let s = unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned();
        (!s.is_empty()).then_some(s)
    }

    /// `Ok(())` for `ncclSuccess`; otherwise an [`NcclError`] carrying the
    /// code, NCCL's description and its last error text. `ncclInProgress`
    /// is an error here: callers of non-blocking communicators test for it
    /// before calling this.
    ///
    /// # Errors
    ///
    /// Any code other than `ncclSuccess`.
    pub fn check(&self, code: ncclResult_t) -> Result<(), NcclError> {
        if code.is_success() {
            return Ok(());
        }
        Err(NcclError {
            code,
            text: self.error_string(code),
            last: self.last_error(),
        })
    }
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("missing_optional", &self.missing_optional())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_is_listed_once() {
        let mut all: Vec<&str> = REQUIRED_SYMBOLS.to_vec();
        all.extend_from_slice(OPTIONAL_SYMBOLS);
        assert_eq!(all.len(), 27);
        let mut dedup = all.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), all.len());
    }

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
