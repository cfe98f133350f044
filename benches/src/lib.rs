//! Benchmark support code.
pub mod store;
