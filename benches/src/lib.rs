//! Benchmark support code, shared by the bench programs in `src/bin/` and
//! the criterion benches in `benches/` (the one-rank GPU group the
//! single-GPU benches measure is `chorus::test_util::one_rank_group`):
//!
//! * `submission`: [`submit_each`], the submission loop of the grouped and
//!   one-by-one benches;
//! * `works`: [`started_work`], [`started_batch`] and
//!   [`work_bookkeeping_round`], works registered as the NCCL path does,
//!   without a GPU;
//! * `profile`: [`print_profile`], the enqueue phases' medians;
//! * [`store`]: the store workload of the store benches.
#![forbid(unsafe_code)]

mod profile;
pub mod store;
mod submission;
mod works;

pub use profile::print_profile;
pub use submission::submit_each;
pub use works::{started_batch, started_work, work_bookkeeping_round};
