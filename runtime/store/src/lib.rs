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
//!
//! # The store
//!
//! * [`Store`]: the trait every store implements; everyone holds an
//!   `Arc<dyn Store>`.
//! * [`TcpStoreServer`] / [`TcpStore`]: the TCP server (on rank 0's host)
//!   and its client. Both run on chorus's background runtime
//!   ([`crate::rt`]), so every operation can be awaited from any executor.
//!   A client pipelines requests on one connection: concurrent operations
//!   share round trips, and a waiting `get` holds up nothing else.
//! * [`PrefixStore`]: namespaces a group's keys inside another store.
//! * [`InMemoryStore`]: the same trait for single-process use.
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
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::time::Duration;

mod client;
mod io;
mod memory;
mod prefix;
pub mod rendezvous;
pub mod rt;
mod server;
pub(crate) mod wire;

pub use client::{ClientOptions, TcpStore};
pub use memory::InMemoryStore;
pub use prefix::PrefixStore;
pub use server::{ServerOptions, TcpStoreServer};
pub use wire::{MAX_FRAME_LEN, MAX_KEYS_PER_OP, MAX_KEY_LEN, MAX_TOKEN_LEN, MAX_VALUE_LEN};

/// Environment variable holding the shared store token.
pub const TOKEN_ENV: &str = "CHORUS_STORE_TOKEN";

/// Default time a waiting operation (get, wait, multi_get) waits for its keys.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Errors of store operations.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Keys did not appear within the timeout.
    #[error("store timeout: keys {keys:?} did not appear within {after:?}; a rank has not reached this point (is it alive? did it call the same ops?)")]
    Timeout {
        /// The keys that were waited for.
        keys: Vec<String>,
        /// The timeout that expired.
        after: Duration,
    },
    /// The connection to the store failed or closed.
    #[error("store connection to {addr} failed: {cause}; is the store server (rank 0) alive and reachable?")]
    Connection {
        /// The server address.
        addr: String,
        /// The I/O error.
        cause: String,
    },
    /// The server refused our token.
    #[error(
        "store server refused authentication: {0}; set the same CHORUS_STORE_TOKEN on every rank"
    )]
    Auth(String),
    /// A key, value or frame exceeds a hard limit.
    #[error("store {what} is {len} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// Which thing was too large ("key", "value", "frame").
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The peer sent something that is not a valid frame.
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// The stored value is not what the operation expects (e.g. `add` on a
    /// value that is not a decimal i64).
    #[error("store value of key '{key}' is not valid for this operation: {msg}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong.
        msg: String,
    },
    /// chorus's background I/O runtime could not start or run the task.
    #[error("store I/O runtime unavailable: {0}")]
    Runtime(String),
    /// This store does not implement the operation.
    #[error("store operation {op} is not supported by {store}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The store type.
        store: &'static str,
    },
}

/// A key-value store shared by the ranks of a job.
///
/// Keys are UTF-8 strings, values are bytes. Operations that wait for keys
/// (`get`, `wait`, `multi_get`) are woken when the key is set, never by
/// polling, and give up after a timeout.
///
/// # Errors
///
/// Every operation fails with [`StoreError::TooLarge`] for a key, value,
/// key list or frame over its limit, and (for a remote store) with
/// [`StoreError::Connection`] once the connection is gone; waiting ones with
/// [`StoreError::Timeout`] naming the keys still missing; `add` with
/// [`StoreError::InvalidValue`] on a value that is not a decimal i64 or on
/// overflow.
///
/// # Cancel safety
///
/// Dropping a waiting operation unregisters it. Dropping a remote
/// operation does not recall its request: a dropped `set` may or may not
/// have taken effect.
#[async_trait::async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Sets `key` to `value`, waking every waiter on it.
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;

    /// Gets the value of `key`, waiting up to `timeout` for it to exist.
    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError>;

    /// Adds `delta` to the i64 stored at `key` (missing counts as 0) and
    /// returns the new value. The value is stored as decimal text.
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;

    /// Sets `key` to `desired` if its current value is `expected` (or if it
    /// is missing and `expected` is empty); returns the value stored after the
    /// operation (empty if the key is still missing).
    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError>;

    /// Waits until every key in `keys` exists, up to `timeout`.
    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError>;

    /// True if every key in `keys` exists now.
    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError>;

    /// Deletes `key`; true if it existed.
    async fn delete(&self, key: &str) -> Result<bool, StoreError>;

    /// Number of keys in the store (under this store's prefix, for a
    /// prefix store).
    async fn num_keys(&self) -> Result<u64, StoreError>;

    /// Number of keys whose name starts with `prefix` (counted inside this
    /// store's own namespace, for a prefix store).
    ///
    /// [`PrefixStore::num_keys`](Store::num_keys) uses it to count only its
    /// own keys. The default returns [`StoreError::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] where not implemented, or the store's
    /// own errors.
    async fn num_keys_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let _ = prefix;
        Err(StoreError::Unsupported {
            op: "num_keys_with_prefix",
            store: std::any::type_name::<Self>(),
        })
    }

    /// Gets several keys, waiting up to `timeout` for all of them.
    async fn multi_get(&self, keys: &[&str], timeout: Duration)
        -> Result<Vec<Vec<u8>>, StoreError>;

    /// Sets several keys at once.
    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError>;
}

/// Locks `m`, taking the data back from a thread that panicked holding it:
/// the store's tables stay consistent between statements.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
