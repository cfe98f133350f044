//! Errors of loading NCCL and of NCCL calls.

use std::fmt;

use crate::sys::ncclResult_t;

/// A version of NCCL, decoded from `ncclGetVersion`'s code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion {
    /// Major version (2).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl NcclVersion {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Decodes `NCCL_VERSION_CODE`: `X*1000 + Y*100 + Z` up to 2.8, and
    /// `X*10000 + Y*100 + Z` from 2.9 on. `None` for a negative code.
    pub const fn from_code(code: i32) -> Option<Self> {
        if code < 0 {
            return None;
        }
        let code = code as u32;
        Some(if code < 10_000 {
            Self::new(code / 1000, (code % 1000) / 100, code % 100)
        } else {
            Self::new(code / 10_000, (code % 10_000) / 100, code % 100)
        })
    }

    /// The code `ncclGetVersion` returns for this version.
    pub const fn code(self) -> i32 {
        if self.major <= 2 && self.minor <= 8 {
            (self.major * 1000 + self.minor * 100 + self.patch) as i32
        } else {
            (self.major * 10_000 + self.minor * 100 + self.patch) as i32
        }
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why NCCL could not be loaded.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclLoadError {
    /// No candidate library could be opened.
    #[error(
        "NCCL backend unavailable: no NCCL library could be loaded{}; install NCCL \
         (e.g. `pip install nvidia-nccl-cu12`, or the libnccl2 package), add its folder to \
         LD_LIBRARY_PATH, or point CHORUS_NCCL_LIBRARY at libnccl.so.2",
        list_searched(searched, reasons)
    )]
    BackendUnavailable {
        /// Every place tried, in order.
        searched: Vec<String>,
        /// Why each opened candidate failed, as `"candidate: reason"`, in the
        /// same order as `searched` (places that matched no file have none).
        reasons: Vec<String>,
    },
    /// A library was found but is older than the minimum chorus supports.
    #[error(
        "NCCL at {path} is version {found}, older than the minimum {minimum} chorus supports; \
         install a newer NCCL or point CHORUS_NCCL_LIBRARY at one"
    )]
    TooOld {
        /// The library that was found.
        path: String,
        /// Its version.
        found: NcclVersion,
        /// The minimum supported version ([`crate::MIN_VERSION`]).
        minimum: NcclVersion,
    },
    /// A library was opened but lacks required NCCL symbols: it is not NCCL,
    /// or a build of it that leaves out parts chorus needs.
    #[error(
        "{path} is not a usable NCCL library: missing symbol(s) {}; point CHORUS_NCCL_LIBRARY \
         at a real libnccl.so.2",
        missing.join(", ")
    )]
    MissingSymbol {
        /// The library that was opened.
        path: String,
        /// The required symbols it does not export.
        missing: Vec<&'static str>,
    },
    /// `ncclGetVersion` itself failed or returned a nonsense code.
    #[error("ncclGetVersion of {path} failed: {detail}")]
    VersionQuery {
        /// The library that was opened.
        path: String,
        /// The result code or the bad version code.
        detail: String,
    },
}

fn list_searched(searched: &[String], reasons: &[String]) -> String {
    if searched.is_empty() {
        return " (nothing was searched: the search plan was empty)".to_owned();
    }
    let mut s = format!("; searched: {}", searched.join(", "));
    if !reasons.is_empty() {
        s.push_str("; failures: ");
        s.push_str(&reasons.join("; "));
    }
    s
}

/// A failed NCCL call: the result code with NCCL's own description.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("NCCL error {code}: {text}{}", last.as_ref().map(|l| format!(" (last error: {l})")).unwrap_or_default())]
pub struct NcclError {
    /// The result code.
    pub code: ncclResult_t,
    /// `ncclGetErrorString(code)`.
    pub text: String,
    /// `ncclGetLastError`, when the library has it and it said something.
    pub last: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_round_trip_in_both_encodings() {
        let v = NcclVersion::from_code(21803).unwrap();
        assert_eq!(v, NcclVersion::new(2, 18, 3));
        assert_eq!(v.code(), 21803);
        let old = NcclVersion::from_code(2804).unwrap();
        assert_eq!(old, NcclVersion::new(2, 8, 4));
        assert_eq!(old.code(), 2804);
        assert_eq!(NcclVersion::from_code(22809).unwrap().to_string(), "2.28.9");
        assert!(NcclVersion::new(2, 9, 0) > NcclVersion::new(2, 8, 4));
        assert!(NcclVersion::from_code(-1).is_none());
    }

    #[test]
    fn error_messages_say_what_and_what_to_do() {
        let e = NcclLoadError::BackendUnavailable {
            searched: vec!["/x (from CHORUS_NCCL_LIBRARY)".into()],
            reasons: vec!["/x: no such file".into()],
        };
        let s = e.to_string();
        assert!(s.contains("/x (from CHORUS_NCCL_LIBRARY)") && s.contains("no such file"));
        assert!(s.contains("LD_LIBRARY_PATH"));
        let e = NcclError {
            code: ncclResult_t::ncclSystemError,
            text: "unhandled system error".into(),
            last: None,
        };
        assert_eq!(
            e.to_string(),
            "NCCL error ncclSystemError (code 2): unhandled system error"
        );
    }
}
