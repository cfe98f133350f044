//! A client of PyTorch's `torch.distributed.TCPStore`.
//!
//! torchrun's elastic agent serves a TCPStore on `MASTER_ADDR:MASTER_PORT`
//! and tells its workers so with `TORCHELASTIC_USE_AGENT_STORE=True`; the
//! port is then taken, and the workers are meant to use that store rather
//! than host their own. [`TorchStore`] is chorus's [`Store`](crate::Store)
//! over it, and [`rendezvous`](crate::rendezvous) uses it there. It also
//! lets a chorus program share keys with Python processes of the same job.
//!
//! `wire` holds the protocol itself, free of I/O; `conn` runs one
//! connection; `client` ([`TorchStore`]) maps the [`Store`](crate::Store)
//! operations onto it.

mod client;
mod conn;
pub(crate) mod wire;

pub use client::{TorchStore, TorchStoreOptions};
