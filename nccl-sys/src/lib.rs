//! Raw NCCL bindings, loaded at run time.
//!
//! Placeholder while the loader is written (see issue 4).
#![warn(missing_docs)]
