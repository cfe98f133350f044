//! [`StoreError`]: what can go wrong with a store operation.

use std::time::Duration;

/// Errors of store operations.
///
/// `Debug` shows the message (so `?` in `main` prints it); `{:#?}` the
/// structure.
#[derive(Clone, thiserror::Error)]
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

chorus_core::debug_shows_message!(StoreError {
    Timeout { keys, after },
    Connection { addr, cause },
    Auth(reason),
    TooLarge { what, len, limit },
    Protocol(msg),
    InvalidValue { key, msg },
    Runtime(msg),
    Unsupported { op, store },
});
