//! Loom models of chorus-runtime's concurrency core: the communicator cache
//! with its in-initialization map, and the work slot and registry.
//!
//! The models live in `tests/`; this library holds what they share (a fake
//! communicator factory, a buffer that counts its drops, the model runner).
//! Everything here exists only under `cfg(loom)`; run the suite with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p chorus-loom-tests --release
//! ```
#![warn(missing_docs)]

#[cfg(loom)]
mod fakes;

#[cfg(loom)]
pub use fakes::*;
