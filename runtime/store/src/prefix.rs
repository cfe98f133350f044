//! A store that namespaces a group's keys inside another store.

use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::store::Store;

/// Keys of this store are `"{prefix}/{key}"` in the inner store.
///
/// Errors that name keys (timeouts, invalid values) name them without the
/// prefix, as the caller wrote them. [`Store::num_keys`] counts only the
/// keys under this prefix, through the inner store's
/// [`Store::num_keys_with_prefix`] (every store of this crate implements
/// it; an inner store that does not makes `num_keys` fail with
/// [`StoreError::Unsupported`] rather than count other groups' keys).
#[derive(Clone, Debug)]
pub struct PrefixStore {
    /// `prefix` followed by `/`.
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    /// Namespaces `inner`'s keys under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        let mut prefix = prefix.into();
        prefix.push('/');
        PrefixStore { prefix, inner }
    }

    /// The prefix, without the trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix[..self.prefix.len() - 1]
    }

    /// The store underneath.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + key.len());
        k.push_str(&self.prefix);
        k.push_str(key);
        k
    }

    fn strip(&self, key: String) -> String {
        match key.strip_prefix(self.prefix.as_str()) {
            Some(k) => k.to_owned(),
            None => key,
        }
    }

    /// Names keys in `e` as the caller wrote them.
    fn unprefix(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Timeout { keys, after } => StoreError::Timeout {
                keys: keys.into_iter().map(|k| self.strip(k)).collect(),
                after,
            },
            StoreError::InvalidValue { key, msg } => StoreError::InvalidValue {
                key: self.strip(key),
                msg,
            },
            other => other,
        }
    }
}

#[async_trait::async_trait]
impl Store for PrefixStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(&self.key(key), value).await
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.inner
            .get(&self.key(key), timeout)
            .await
            .map_err(|e| self.unprefix(e))
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.inner
            .add(&self.key(key), delta)
            .await
            .map_err(|e| self.unprefix(e))
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.inner
            .compare_set(&self.key(key), expected, desired)
            .await
            .map_err(|e| self.unprefix(e))
    }

    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let owned: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        self.inner
            .wait(&refs, timeout)
            .await
            .map_err(|e| self.unprefix(e))
    }

    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let owned: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        self.inner.check(&refs).await
    }

    async fn present(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        let owned: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        self.inner.present(&refs).await
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.delete(&self.key(key)).await
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        self.inner.num_keys_with_prefix(&self.prefix).await
    }

    async fn num_keys_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.inner.num_keys_with_prefix(&self.key(prefix)).await
    }

    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let owned: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
        self.inner
            .multi_get(&refs, timeout)
            .await
            .map_err(|e| self.unprefix(e))
    }

    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        let owned: Vec<String> = entries.iter().map(|(k, _)| self.key(k)).collect();
        let refs: Vec<(&str, &[u8])> = owned
            .iter()
            .zip(entries)
            .map(|(k, (_, v))| (k.as_str(), *v))
            .collect();
        self.inner.multi_set(&refs).await
    }
}
