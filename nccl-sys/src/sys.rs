//! The C types of `nccl.h`, laid out as the library expects them, and the
//! function pointer types of the symbols chorus resolves.
//!
//! Names follow the C header so that a reader can grep NCCL's documentation.
//! Enumerations are `#[repr(transparent)]` newtypes over `c_int` rather than
//! Rust enums: a newer library may return a code this crate does not know, and
//! a Rust enum holding an unknown discriminant would be undefined behaviour.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;

/// Opaque communicator object behind [`ncclComm_t`].
#[repr(C)]
#[derive(Debug)]
pub struct ncclComm {
    _private: [u8; 0],
}

/// Handle to a communicator (`struct ncclComm*`). Null means "no communicator".
pub type ncclComm_t = *mut ncclComm;

/// A CUDA stream handle as NCCL takes it (`cudaStream_t`, the same pointer as
/// the driver's `CUstream`). Null is the legacy default stream.
pub type cudaStream_t = *mut c_void;

/// Size in bytes of [`ncclUniqueId`] (`NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The id every rank of a new communicator must pass to `ncclCommInitRank`:
/// created by one rank with `ncclGetUniqueId` and sent to the others (through
/// the store, in chorus). Plain bytes: safe to copy and send anywhere.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ncclUniqueId {
    /// The opaque bytes (`char internal[128]` in C).
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    /// An all-zero id, to be filled in by `ncclGetUniqueId`.
    pub const fn zeroed() -> Self {
        Self {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }

    /// The id as bytes, for sending it through a store.
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        // `c_char` is `i8` or `u8` depending on the target; `as u8` keeps the
        // bit pattern in both cases.
        self.internal.map(|c| c as u8)
    }

    /// Rebuilds an id from the bytes of [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        Self {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

impl Default for ncclUniqueId {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first bytes are enough to tell ids apart in logs.
        let bytes = self.to_bytes();
        write!(f, "ncclUniqueId(")?;
        for b in &bytes[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// Result code of every NCCL call (`ncclResult_t`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclResult_t(pub c_int);

impl ncclResult_t {
    /// The call succeeded.
    pub const ncclSuccess: Self = Self(0);
    /// A call to a CUDA function failed.
    pub const ncclUnhandledCudaError: Self = Self(1);
    /// A call to the system failed (socket, memory, ...).
    pub const ncclSystemError: Self = Self(2);
    /// An internal check of NCCL failed (a bug or memory corruption).
    pub const ncclInternalError: Self = Self(3);
    /// An argument was invalid.
    pub const ncclInvalidArgument: Self = Self(4);
    /// The call was used wrongly (wrong order, wrong communicator state).
    pub const ncclInvalidUsage: Self = Self(5);
    /// A remote peer failed or disappeared (since 2.9).
    pub const ncclRemoteError: Self = Self(6);
    /// A non-blocking call is still in progress (since 2.14).
    pub const ncclInProgress: Self = Self(7);
    /// A timeout expired (recent versions).
    pub const ncclTimeout: Self = Self(8);

    /// Whether this is `ncclSuccess`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Whether this is `ncclInProgress`: not an error for non-blocking
    /// communicators, the operation goes on in the background.
    pub const fn is_in_progress(self) -> bool {
        self.0 == 7
    }

    /// The C name of the code (`"ncclSystemError"`), or `"unknown"` for a
    /// code this crate does not know.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            8 => "ncclTimeout",
            _ => "unknown",
        }
    }
}

impl fmt::Debug for ncclResult_t {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for ncclResult_t {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.name(), self.0)
    }
}

/// Element type of a buffer (`ncclDataType_t`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ncclDataType_t(pub c_int);

impl ncclDataType_t {
    /// `int8_t` (also `ncclChar`).
    pub const ncclInt8: Self = Self(0);
    /// `uint8_t`.
    pub const ncclUint8: Self = Self(1);
    /// `int32_t` (also `ncclInt`).
    pub const ncclInt32: Self = Self(2);
    /// `uint32_t`.
    pub const ncclUint32: Self = Self(3);
    /// `int64_t`.
    pub const ncclInt64: Self = Self(4);
    /// `uint64_t`.
    pub const ncclUint64: Self = Self(5);
    /// IEEE half precision (also `ncclHalf`).
    pub const ncclFloat16: Self = Self(6);
    /// `float` (also `ncclFloat`).
    pub const ncclFloat32: Self = Self(7);
    /// `double` (also `ncclDouble`).
    pub const ncclFloat64: Self = Self(8);
    /// bfloat16 (NCCL built with CUDA 11 or later).
    pub const ncclBfloat16: Self = Self(9);
    /// FP8 e4m3 (since 2.24, sm_90 and later).
    pub const ncclFloat8e4m3: Self = Self(10);
    /// FP8 e5m2 (since 2.24, sm_90 and later).
    pub const ncclFloat8e5m2: Self = Self(11);

    /// Size of one element in bytes, or `None` for a code this crate does
    /// not know.
    pub const fn size_bytes(self) -> Option<usize> {
        match self.0 {
            0 | 1 | 10 | 11 => Some(1),
            6 | 9 => Some(2),
            2 | 3 | 7 => Some(4),
            4 | 5 | 8 => Some(8),
            _ => None,
        }
    }
}

/// Reduction operation (`ncclRedOp_t`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ncclRedOp_t(pub c_int);

impl ncclRedOp_t {
    /// Sum.
    pub const ncclSum: Self = Self(0);
    /// Product.
    pub const ncclProd: Self = Self(1);
    /// Maximum.
    pub const ncclMax: Self = Self(2);
    /// Minimum.
    pub const ncclMin: Self = Self(3);
    /// Average (sum divided by the number of ranks; since 2.10).
    pub const ncclAvg: Self = Self(4);
}

/// `NCCL_CONFIG_UNDEF_INT`: "let NCCL choose" for an integer field of
/// [`ncclConfig_t`].
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `NCCL_API_MAGIC`: the value of [`ncclConfig_t::magic`]; NCCL rejects a
/// config that does not carry it.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;

/// `NCCL_SPLIT_NOCOLOR`: the colour a rank passes to `ncclCommSplit` to stay
/// out of every new communicator.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `NCCL_SHRINK_DEFAULT`: `ncclCommShrink` of a healthy, idle parent.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;

/// `NCCL_SHRINK_ABORT`: `ncclCommShrink` first stops the parent's ongoing
/// operations (a parent whose peers failed).
pub const NCCL_SHRINK_ABORT: c_int = 0x01;

/// `NCCL_REVOKE_DEFAULT`: the only flag `ncclCommRevoke` takes.
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;

/// The version code that [`ncclConfig_t`]'s layout corresponds to (2.27.0).
pub const NCCL_CONFIG_LAYOUT_VERSION: c_uint = 22700;

/// Communicator configuration (`ncclConfig_t`), in the layout of NCCL 2.27
/// (`struct ncclConfig_v22700`).
///
/// NCCL's config struct is append-only and versioned: the library copies
/// `min(size, its own sizeof(ncclConfig_t))` bytes over its defaults, so
///
/// * an older library (2.18 – 2.26) reads the prefix it knows and ignores the
///   rest, and
/// * a newer library (2.28+) keeps its defaults for the fields it added after
///   `nvlsCTAs`.
///
/// Fields added in 2.25 / 2.27 are reset to their defaults by NCCL when
/// [`version`](Self::version) is below those versions; this struct says it
/// is a 2.27 config, so they are honoured by every library that knows them.
///
/// Build it with [`ncclConfig_t::initializer`] (or `Default`), the
/// equivalent of C's `NCCL_CONFIG_INITIALIZER`, then set what you need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    /// `sizeof(ncclConfig_t)`; do not change.
    pub size: usize,
    /// [`NCCL_API_MAGIC`]; do not change.
    pub magic: c_uint,
    /// Version code of this layout ([`NCCL_CONFIG_LAYOUT_VERSION`]).
    pub version: c_uint,
    /// 1: calls block until done (default); 0: calls may return
    /// `ncclInProgress` and the caller polls `ncclCommGetAsyncError`.
    pub blocking: c_int,
    /// CUDA thread block cluster size (sm_90 and later).
    pub cgaClusterSize: c_int,
    /// Minimum number of CTAs (channels) per collective.
    pub minCTAs: c_int,
    /// Maximum number of CTAs (channels) per collective.
    pub maxCTAs: c_int,
    /// Network module to use (C string), or null for the default.
    pub netName: *const c_char,
    /// 1: a communicator created by `ncclCommSplit` shares resources with its
    /// parent (since 2.18).
    pub splitShare: c_int,
    /// Traffic class for network QoS (since 2.25).
    pub trafficClass: c_int,
    /// Name of the communicator in NCCL's logs (C string) or null.
    pub commName: *const c_char,
    /// 1: enable CollNet (since 2.27).
    pub collnetEnable: c_int,
    /// CTA policy flags (since 2.27).
    pub CTAPolicy: c_int,
    /// 1: a communicator created by `ncclCommShrink` shares resources with
    /// its parent (since 2.27).
    pub shrinkShare: c_int,
    /// Number of CTAs for NVLS collectives (since 2.27).
    pub nvlsCTAs: c_int,
}

impl ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`: size, magic and version set, every other
    /// field "undefined" so NCCL applies its defaults (and its `NCCL_*`
    /// environment variables).
    pub const fn initializer() -> Self {
        Self {
            size: std::mem::size_of::<Self>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_CONFIG_LAYOUT_VERSION,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: NCCL_CONFIG_UNDEF_INT,
            trafficClass: NCCL_CONFIG_UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: NCCL_CONFIG_UNDEF_INT,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            shrinkShare: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        }
    }
}

impl Default for ncclConfig_t {
    fn default() -> Self {
        Self::initializer()
    }
}

/// `ncclResult_t ncclGetVersion(int *version)`.
pub type ncclGetVersion_t = unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t;
/// `ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)`.
pub type ncclGetUniqueId_t = unsafe extern "C" fn(uniqueId: *mut ncclUniqueId) -> ncclResult_t;
/// `ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)`.
pub type ncclCommInitRank_t = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t;
/// `ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)`.
pub type ncclCommInitRankConfig_t = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)`.
pub type ncclCommSplit_t = unsafe extern "C" fn(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)` (2.28):
/// stops the communicator's in-flight operations and refuses new ones,
/// keeping it as a parent for split, shrink and grow. Blocking
/// communicators return when it is quiet; non-blocking ones report
/// `ncclInProgress` through `ncclCommGetAsyncError` until then.
pub type ncclCommRevoke_t =
    unsafe extern "C" fn(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t;
/// `ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags)` (2.27):
/// a communicator of the parent's ranks without the excluded ones,
/// renumbered densely in their order.
pub type ncclCommShrink_t = unsafe extern "C" fn(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t;
/// `ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId)` (2.29):
/// the id of a grow, made by the existing communicator's root.
pub type ncclCommGetUniqueId_t =
    unsafe extern "C" fn(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ncclResult_t;
/// `ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm, ncclConfig_t* config)` (2.29):
/// a communicator of the parent's ranks and new ones after them. Existing
/// ranks pass their communicator and `rank = -1` (the root also the id,
/// the others null); new ranks pass a null communicator, the id and their
/// rank.
pub type ncclCommGrow_t = unsafe extern "C" fn(
    comm: ncclComm_t,
    nRanks: c_int,
    uniqueId: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
/// `ncclResult_t ncclCommFinalize(ncclComm_t comm)`.
pub type ncclCommFinalize_t = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
/// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
pub type ncclCommDestroy_t = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
/// `ncclResult_t ncclCommAbort(ncclComm_t comm)`.
pub type ncclCommAbort_t = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
/// `ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)`.
pub type ncclCommGetAsyncError_t =
    unsafe extern "C" fn(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
/// `const char* ncclGetErrorString(ncclResult_t result)`.
pub type ncclGetErrorString_t = unsafe extern "C" fn(result: ncclResult_t) -> *const c_char;
/// `const char* ncclGetLastError(ncclComm_t comm)`.
pub type ncclGetLastError_t = unsafe extern "C" fn(comm: ncclComm_t) -> *const c_char;
/// `ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)`.
pub type ncclCommCount_t =
    unsafe extern "C" fn(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
/// `ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)`.
pub type ncclCommCuDevice_t =
    unsafe extern "C" fn(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
/// `ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)`.
pub type ncclCommUserRank_t =
    unsafe extern "C" fn(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;
/// `ncclResult_t ncclGroupStart()`.
pub type ncclGroupStart_t = unsafe extern "C" fn() -> ncclResult_t;
/// `ncclResult_t ncclGroupEnd()`.
pub type ncclGroupEnd_t = unsafe extern "C" fn() -> ncclResult_t;
/// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclAllReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclBroadcast_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclAllGather_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclReduceScatter_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclSend_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)`.
pub type ncclRecv_t = unsafe extern "C" fn(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn unique_id_is_128_bytes_and_round_trips() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(200);
        }
        let id = ncclUniqueId::from_bytes(&bytes);
        assert_eq!(id.to_bytes(), bytes);
    }

    #[test]
    fn config_layout_matches_nccl_2_27_header() {
        // Offsets of `struct ncclConfig_v22700` on LP64 (x86-64, aarch64).
        assert_eq!(offset_of!(ncclConfig_t, size), 0);
        assert_eq!(offset_of!(ncclConfig_t, magic), 8);
        assert_eq!(offset_of!(ncclConfig_t, version), 12);
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, cgaClusterSize), 20);
        assert_eq!(offset_of!(ncclConfig_t, minCTAs), 24);
        assert_eq!(offset_of!(ncclConfig_t, maxCTAs), 28);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(ncclConfig_t, trafficClass), 44);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, collnetEnable), 56);
        assert_eq!(offset_of!(ncclConfig_t, CTAPolicy), 60);
        assert_eq!(offset_of!(ncclConfig_t, shrinkShare), 64);
        assert_eq!(offset_of!(ncclConfig_t, nvlsCTAs), 68);
        assert_eq!(size_of::<ncclConfig_t>(), 72);
    }

    #[test]
    fn config_initializer_matches_the_c_macro() {
        let c = ncclConfig_t::default();
        assert_eq!(c.size, 72);
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 22700);
        for v in [
            c.blocking,
            c.cgaClusterSize,
            c.minCTAs,
            c.maxCTAs,
            c.splitShare,
            c.trafficClass,
            c.collnetEnable,
            c.CTAPolicy,
            c.shrinkShare,
            c.nvlsCTAs,
        ] {
            assert_eq!(v, i32::MIN);
        }
        assert!(c.netName.is_null() && c.commName.is_null());
    }

    #[test]
    fn result_codes_have_names() {
        assert_eq!(ncclResult_t::ncclSuccess.name(), "ncclSuccess");
        assert_eq!(ncclResult_t(6).name(), "ncclRemoteError");
        assert_eq!(ncclResult_t(42).name(), "unknown");
        assert!(ncclResult_t(7).is_in_progress());
        assert_eq!(
            ncclResult_t::ncclSystemError.to_string(),
            "ncclSystemError (code 2)"
        );
    }

    #[test]
    fn datatype_sizes() {
        assert_eq!(ncclDataType_t::ncclFloat32.size_bytes(), Some(4));
        assert_eq!(ncclDataType_t::ncclBfloat16.size_bytes(), Some(2));
        assert_eq!(ncclDataType_t::ncclUint64.size_bytes(), Some(8));
        assert_eq!(ncclDataType_t::ncclInt8.size_bytes(), Some(1));
        assert_eq!(ncclDataType_t(99).size_bytes(), None);
    }
}
