//! The integration tests of chorus (`tests/`), the rank programs they start
//! (`src/bin/`: `chorus-test-rank`, `chorus-main-rank`, and
//! `chorus-gpu-rank` for the GPU suite) and what they share:
//!
//! * [`testkit`]: test data, serial references, ranks as tasks of one
//!   process, a check of every op, and the programs the tests build;
//! * [`job_output`]: what a `chorus-run` job prints;
//! * [`netns`]: test hosts in network namespaces.
#![deny(unsafe_code)]

pub mod job_output;
pub mod netns;
pub mod testkit;
