//! Loom models of chorus-core's concurrency: the communicator cache with its
//! in-initialization map, and the work slot and registry.
//!
//! The models live in `tests/`; this library holds what they share (a fake
//! communicator factory, a buffer that counts its drops, the model runner,
//! the single-flight property and a known-bad cache that must break it).
//! The suite depends on chorus-core alone, so `--cfg loom` changes nothing
//! else (tokio is not in its build).
//! Everything here exists only under `cfg(loom)`; run the suite with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p chorus-loom-tests --release
//! ```
//!
//! Files: `fakes` (the shared fakes and the model runner).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(loom)]
mod fakes;

#[cfg(loom)]
pub use fakes::*;
