//! Test kit of the chorus integration tests and test programs:
//!
//! * `elems`: [`TestElem`], random test data any rank can compute for any
//!   rank ([`data`]), [`poison`] and the serial [`reference()`];
//! * `local`: [`local_groups`], ranks as tasks of one process (on a
//!   store of their own, or the test's: [`local_groups_on`]),
//!   [`build_all`] and [`on_all`];
//! * `checks`: [`check_all_ops`] and [`check_all_dtypes`], every op
//!   checked against the reference;
//! * `programs`: [`workspace_bin`], [`example_bin`] and
//!   [`run_self_launching`], programs the tests build and start.

mod checks;
mod elems;
mod local;
mod programs;

pub use checks::{check_all_dtypes, check_all_ops, check_large_all_reduce, LARGE, OPS, SIZES};
pub use elems::{data, poison, reduce_tolerance, reference, TestElem};
pub use local::{build_all, local_groups, local_groups_on, local_groups_with, on_all};
pub use programs::{example_bin, run_self_launching, workspace_bin};
