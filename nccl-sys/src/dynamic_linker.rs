//! The dynamic linker's side: opening a library with NCCL's `dlopen` flags,
//! and finding the file a loaded symbol comes from.

use std::ffi::{c_int, c_void, CStr};

/// `dlopen` flags for NCCL: resolve everything now (a broken library fails
/// here, not at the first collective) and keep its symbols private.
pub(crate) const OPEN_FLAGS: c_int = libc::RTLD_NOW | libc::RTLD_LOCAL;

/// Opens `name` (a path, or a bare name for the dynamic linker) with `flags`.
pub(crate) fn open(name: &str, flags: c_int) -> Result<libloading::Library, String> {
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
pub(crate) fn file_of(symbol: *const c_void) -> Option<String> {
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
