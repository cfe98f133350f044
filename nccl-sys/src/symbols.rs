//! The symbol table: [`Nccl`], one loaded library with its resolved
//! symbols (required ones as function pointers, optional ones as `Option`s),
//! and the lists [`REQUIRED_SYMBOLS`] and [`OPTIONAL_SYMBOLS`].

use std::ffi::c_void;
use std::fmt;

use crate::error::{NcclLoadError, NcclVersion};
use crate::sys::*;

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
        /// library open); the one returned by [`nccl()`](crate::nccl()) lives for the whole
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
            pub(crate) fn resolve(
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
            pub(crate) fn missing_required(lib: &libloading::Library) -> Vec<&'static str> {
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
pub(crate) unsafe fn lookup<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: the caller guarantees `T` matches the symbol; a missing symbol
    // is an `Err`, never a null pointer cast to `T`.
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

impl Nccl {
    /// The file the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library's version (from `ncclGetVersion`).
    pub fn version(&self) -> NcclVersion {
        self.version
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
}
