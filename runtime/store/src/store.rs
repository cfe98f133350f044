//! [`Store`]: the key-value store every rank of a job shares.

use std::fmt;
use std::time::Duration;

use crate::error::StoreError;

/// Default time a waiting operation (get, wait, multi_get) waits for its keys.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

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

    /// Which of `keys` exist now, in order: one request for the lot where
    /// the store has it (chorus's server, the in-memory store), so that a
    /// rank can learn which of N ranks announced themselves without N round
    /// trips. The default asks [`check`](Store::check) key by key (PyTorch's
    /// TCPStore has no such request).
    async fn present(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.check(&[k]).await?);
        }
        Ok(out)
    }

    /// Gets several keys, waiting up to `timeout` for all of them.
    async fn multi_get(&self, keys: &[&str], timeout: Duration)
        -> Result<Vec<Vec<u8>>, StoreError>;

    /// Sets several keys at once.
    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError>;
}
