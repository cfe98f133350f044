//! The launcher behind `chorus-run`: starts N local ranks of a program
//! with the torchrun environment, prefixes their output lines with the rank,
//! forwards signals, and stops the others when one fails.
//!
//! [`main_from_args`] is the `chorus-run` command line;
//! [`launch_local`] starts ranks of a program from a library (the examples
//! use it to launch themselves).
//!
//! Its files:
//!
//! * `entry`: [`main_from_args`] and [`launch_local`], the launcher as
//!   functions.
//! * `cli`: the command line and the per-rank environment it derives.
//! * `supervise`: starting the ranks, watching them, forwarding signals,
//!   stopping them.
//! * `output`: rank output cut into lines, each prefixed with its rank.
//! * `share_gpu`: `--share-gpu`, every local rank on one GPU.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cli;
mod entry;
mod output;
mod share_gpu;
mod supervise;

pub use entry::{launch_local, main_from_args};
