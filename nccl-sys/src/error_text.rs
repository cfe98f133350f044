//! Result codes in words: NCCL's description of a code, the last error it
//! recorded, and [`Nccl::check`], which turns a code into an [`NcclError`].

use std::ffi::CStr;

use crate::error::NcclError;
use crate::symbols::Nccl;
use crate::sys::*;

impl Nccl {
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
