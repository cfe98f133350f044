//! Raw NCCL bindings for chorus, loaded at run time.
//!
//! Nothing here links against NCCL: the crate builds and runs on machines
//! without it, and [`nccl()`] returns a typed [`NcclLoadError`] there. When a
//! library is found, its symbols are resolved one by one into [`Nccl`]:
//! required ones must all be present, optional ones are `Option`s.
//!
//! * [`sys`]: the C types (`ncclComm_t`, `ncclUniqueId`, `ncclResult_t`,
//!   `ncclConfig_t`, ...) and the function pointer types.
//! * `symbols`: [`Nccl`], one loaded library with its resolved symbols, and
//!   the lists of required and optional symbols.
//! * `process_wide`: [`nccl()`], the process-wide library, loaded once, and
//!   [`use_library`], which names it before that first use.
//! * `load`: trying the candidates of a plan in order, the version check
//!   against [`MIN_VERSION`], resolving the symbols.
//! * `dynamic_linker`: `dlopen` with NCCL's flags, and the file a loaded
//!   symbol comes from.
//! * `error_text`: result codes in words, and [`Nccl::check`].
//! * `error`: [`NcclVersion`], [`NcclLoadError`] and [`NcclError`].
//! * [`search`]: [`SearchPlan`], where the library is looked for, in order.
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

mod dynamic_linker;
mod error;
mod error_text;
mod load;
mod process_wide;
pub mod search;
mod symbols;
pub mod sys;

pub use error::{NcclError, NcclLoadError, NcclVersion};
pub use load::MIN_VERSION;
pub use process_wide::{nccl, use_library};
pub use search::{Candidate, SearchPlan};
pub use symbols::{Nccl, OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS};
