//! chorus-store: the job's key-value store, rendezvous, and chorus's own
//! background I/O threads.
//!
//! A map of the crate:
//!
//! * [`Store`] and its implementations (below): the key-value store used for
//!   rendezvous and NCCL id exchange.
//! * [`rendezvous`]: how the ranks of a job find each other (torchrun,
//!   SLURM or Open MPI environment, or a builder) through rank 0's store.
//! * [`rt`]: chorus's own background I/O threads (tokio), so that the
//!   futures chorus returns stay executor-agnostic.
//! * [`wait_report`]: long waits (rendezvous, and chorus's re-forming of
//!   groups) report what they wait for every few seconds.
//!
//! # The store
//!
//! * [`Store`]: the trait every store implements; everyone holds an
//!   `Arc<dyn Store>`.
//! * [`TcpStoreServer`] / [`TcpStore`]: the TCP server (on rank 0's host)
//!   and its client. Both run on chorus's background runtime
//!   ([`crate::rt`]), so every operation can be awaited from any executor.
//!   A client pipelines requests on one connection: concurrent operations
//!   share round trips, and a waiting `get` holds up nothing else. A
//!   request alone in flight is written, and its reply read, by the
//!   caller's thread, without a hand-off to the I/O threads, which still
//!   watch the connection for loss and overdue replies.
//! * [`PrefixStore`]: namespaces a group's keys inside another store.
//! * [`InMemoryStore`]: the same trait for single-process use.
//! * [`TorchStore`]: a client of PyTorch's `TCPStore` (torchrun's agent
//!   store), speaking PyTorch's protocol.
//!
//! Waiting operations (`get`, `wait`, `multi_get`) are woken by the `set`
//! that completes them, never by polling, and fail with
//! [`StoreError::Timeout`] naming the keys still missing.
//!
//! Wire format: length-prefixed frames with a version byte; hard limits on
//! keys ([`MAX_KEY_LEN`]), values ([`MAX_VALUE_LEN`]), key lists
//! ([`MAX_KEYS_PER_OP`]) and frames ([`MAX_FRAME_LEN`]), checked before
//! anything is allocated. A client that sends a bad frame gets an error
//! frame and is disconnected; the others are not disturbed.
//!
//! **Security.** The server binds to the address it is given. It has no
//! encryption and only optional shared-token authentication
//! ([`ServerOptions::token`], [`ClientOptions::token`], or
//! `CHORUS_STORE_TOKEN` through their `from_env()`): bind it to the
//! cluster's private network only, never expose it beyond it.
//!
//! # Files
//!
//! `config` (the `CHORUS_*` variables of this layer), `error`
//! ([`StoreError`]), `wire` (the wire format), `io` (socket buffers), `store` ([`Store`]), `memory` ([`InMemoryStore`],
//! and the table the server serves), `prefix` ([`PrefixStore`]), `server`
//! ([`TcpStoreServer`]), `server_stats` ([`ServerStats`]), `client_conn` (a client's connection), `client`
//! ([`TcpStore`]), `torch` ([`TorchStore`]), [`rendezvous`], [`rt`],
//! [`wait_report`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod client_conn;
mod config;
mod error;
mod io;
mod memory;
mod prefix;
pub mod rendezvous;
pub mod rt;
mod server;
mod server_stats;
mod store;
mod torch;
pub mod wait_report;
pub(crate) mod wire;

pub use client::{ClientOptions, TcpStore};
pub use config::TOKEN_ENV;
pub use error::StoreError;
pub use memory::InMemoryStore;
pub use prefix::PrefixStore;
pub use server::{ServerOptions, TcpStoreServer};
pub use server_stats::ServerStats;
pub use store::{Store, DEFAULT_TIMEOUT};
pub use torch::{TorchStore, TorchStoreOptions};
pub use wire::{MAX_FRAME_LEN, MAX_KEYS_PER_OP, MAX_KEY_LEN, MAX_TOKEN_LEN, MAX_VALUE_LEN};
