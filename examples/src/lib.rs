//! Helpers shared by the chorus examples:
//!
//! * `launch`: [`launch_self_if_needed`] and
//!   [`launch_self_restarting_if_needed`], a program that starts its own
//!   ranks when no launcher started it;
//! * `run_rank`: [`run_rank`], one rank of an example (join, body, leave),
//!   and its error type [`BoxError`];
//! * `rank_data`: [`rank_data`], test data any rank can compute for any
//!   rank;
//! * [`busbw`]: bytes and bus bandwidth of an op, as nccl-tests counts them;
//!   [`latency`]: per-iteration latency across ranks; [`timed`]: one op run
//!   many times; [`report`]: the quickstart's report;
//! * [`gpu_train`]: the GPU trainer of `examples/gpu_trainer.rs`.
//!
//! The tests of the examples (`tests/`) run them; the integration tests of
//! chorus are a package of their own, `tests-integration`.
#![deny(unsafe_code)]

pub mod busbw;
pub mod gpu_train;
pub mod latency;
mod launch;
mod rank_data;
pub mod report;
mod run_rank;
pub mod timed;

pub use launch::{launch_self_if_needed, launch_self_restarting_if_needed};
pub use rank_data::rank_data;
pub use run_rank::{run_rank, BoxError};
