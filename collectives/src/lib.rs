//! chorus: async collectives for Rust.
#![warn(missing_docs)]

pub(crate) mod backend;
pub mod dtype;
pub mod error;
pub mod reduce;

pub use backend::tcp::TcpOptions;
pub use dtype::{DType, Element, HostBuffer, ReduceOp};
pub use error::{Error, Rejected};
