//! The in-memory store, and the key-value table the TCP server serves.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;

use crate::error::StoreError;
use crate::store::Store;
use crate::wire;
use std::sync::{Arc, Mutex};

use chorus_core::sync::lock;

/// A waiter registered on one or more missing keys; a set of any of them
/// wakes it, and it looks again.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    woken: AtomicBool,
    waker: AtomicWaker,
}

impl Waiter {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Resolves once [`Waiter::wake`] has been called.
    fn woken(&self) -> impl Future<Output = ()> + '_ {
        futures::future::poll_fn(move |cx| {
            if self.woken.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            if self.woken.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

#[derive(Debug, Default)]
struct Table {
    map: HashMap<String, Vec<u8>>,
    /// Waiters per missing key.
    waiters: HashMap<String, Vec<Arc<Waiter>>>,
}

impl Table {
    /// Stores `value` and returns the waiters on `key`, to be woken once
    /// the lock is released.
    fn insert(&mut self, key: &str, value: Vec<u8>, woken: &mut Vec<Arc<Waiter>>) {
        match self.map.get_mut(key) {
            Some(v) => *v = value,
            None => {
                self.map.insert(key.to_owned(), value);
                if let Some(w) = self.waiters.remove(key) {
                    woken.extend(w);
                }
            }
        }
    }

    /// Registers `w` on every key of `keys` that is missing.
    fn register_missing(&mut self, keys: &[&str], w: &Arc<Waiter>) {
        for k in keys {
            if !self.map.contains_key(*k) {
                self.waiters
                    .entry((*k).to_owned())
                    .or_default()
                    .push(Arc::clone(w));
            }
        }
    }

    fn unregister(&mut self, keys: &[&str], w: &Arc<Waiter>) {
        for k in keys {
            if let Some(list) = self.waiters.get_mut(*k) {
                list.retain(|x| !Arc::ptr_eq(x, w));
                if list.is_empty() {
                    self.waiters.remove(*k);
                }
            }
        }
    }

    fn missing(&self, keys: &[&str]) -> Vec<String> {
        keys.iter()
            .filter(|k| !self.map.contains_key(**k))
            .map(|k| (*k).to_owned())
            .collect()
    }
}

/// The key-value table: one lock, waiters woken by sets.
#[derive(Debug, Default)]
pub(crate) struct Kv {
    table: Mutex<Table>,
}

fn wake_all(woken: Vec<Arc<Waiter>>) {
    for w in woken {
        w.wake();
    }
}

/// Parses a stored counter.
fn parse_counter(key: &str, v: &[u8]) -> Result<i64, StoreError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| StoreError::InvalidValue {
            key: key.to_owned(),
            msg: format!(
                "add needs a decimal i64, found {} bytes {:?}",
                v.len(),
                String::from_utf8_lossy(&v[..v.len().min(64)])
            ),
        })
}

impl Kv {
    pub(crate) fn set(&self, key: &str, value: Vec<u8>) {
        let mut woken = Vec::new();
        lock(&self.table).insert(key, value, &mut woken);
        wake_all(woken);
    }

    pub(crate) fn multi_set(&self, entries: &[(&str, &[u8])]) {
        let mut woken = Vec::new();
        {
            let mut t = lock(&self.table);
            for (k, v) in entries {
                t.insert(k, v.to_vec(), &mut woken);
            }
        }
        wake_all(woken);
    }

    pub(crate) fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut woken = Vec::new();
        let new = {
            let mut t = lock(&self.table);
            let old = match t.map.get(key) {
                Some(v) => parse_counter(key, v)?,
                None => 0,
            };
            let new = old
                .checked_add(delta)
                .ok_or_else(|| StoreError::InvalidValue {
                    key: key.to_owned(),
                    msg: format!("{old} + {delta} overflows i64"),
                })?;
            t.insert(key, new.to_string().into_bytes(), &mut woken);
            new
        };
        wake_all(woken);
        Ok(new)
    }

    pub(crate) fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8> {
        let mut woken = Vec::new();
        let out = {
            let mut t = lock(&self.table);
            match t.map.get(key) {
                Some(cur) if cur.as_slice() == expected => {
                    t.insert(key, desired.to_vec(), &mut woken);
                    desired.to_vec()
                }
                Some(cur) => cur.clone(),
                None if expected.is_empty() => {
                    t.insert(key, desired.to_vec(), &mut woken);
                    desired.to_vec()
                }
                None => Vec::new(),
            }
        };
        wake_all(woken);
        out
    }

    pub(crate) fn check(&self, keys: &[&str]) -> bool {
        let t = lock(&self.table);
        keys.iter().all(|k| t.map.contains_key(*k))
    }

    pub(crate) fn present(&self, keys: &[&str]) -> Vec<bool> {
        let t = lock(&self.table);
        keys.iter().map(|k| t.map.contains_key(*k)).collect()
    }

    pub(crate) fn delete(&self, key: &str) -> bool {
        lock(&self.table).map.remove(key).is_some()
    }

    pub(crate) fn num_keys(&self, prefix: &str) -> u64 {
        let t = lock(&self.table);
        if prefix.is_empty() {
            t.map.len() as u64
        } else {
            t.map.keys().filter(|k| k.starts_with(prefix)).count() as u64
        }
    }

    /// Runs `take` on the table, under its lock, until it returns a value;
    /// between tries waits for a set of one of the `keys` that are missing,
    /// or until `sleep` resolves (then the error names the keys still
    /// missing and says `after`).
    ///
    /// `take` must return `Some` once every key of `keys` exists.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future unregisters its waiter.
    pub(crate) async fn wait_for<T, S: Future<Output = ()>>(
        &self,
        keys: &[&str],
        after: Duration,
        sleep: S,
        mut take: impl FnMut(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Result<T, StoreError> {
        let mut sleep = std::pin::pin!(sleep);
        loop {
            let w = Arc::new(Waiter::default());
            {
                let mut t = lock(&self.table);
                if let Some(v) = take(&t.map) {
                    return Ok(v);
                }
                t.register_missing(keys, &w);
            }
            let guard = Unregister {
                kv: self,
                keys,
                w: &w,
            };
            let woken = std::pin::pin!(w.woken());
            let timed_out = matches!(
                futures::future::select(woken, sleep.as_mut()).await,
                futures::future::Either::Right(_)
            );
            drop(guard);
            if timed_out {
                let t = lock(&self.table);
                if let Some(v) = take(&t.map) {
                    return Ok(v);
                }
                return Err(StoreError::Timeout {
                    keys: t.missing(keys),
                    after,
                });
            }
        }
    }

    /// Reads with `take` now, without waiting.
    pub(crate) fn try_take<T>(
        &self,
        take: impl FnOnce(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Option<T> {
        take(&lock(&self.table).map)
    }
}

/// `take` for `get`.
pub(crate) fn take_one(key: &str) -> impl Fn(&HashMap<String, Vec<u8>>) -> Option<Vec<u8>> + '_ {
    move |m| m.get(key).cloned()
}

/// `take` for `multi_get`.
pub(crate) fn take_all<'a>(
    keys: &'a [&'a str],
) -> impl Fn(&HashMap<String, Vec<u8>>) -> Option<Vec<Vec<u8>>> + 'a {
    move |m| keys.iter().map(|k| m.get(*k).cloned()).collect()
}

/// `take` for `wait`.
pub(crate) fn take_present<'a>(
    keys: &'a [&'a str],
) -> impl Fn(&HashMap<String, Vec<u8>>) -> Option<()> + 'a {
    move |m| keys.iter().all(|k| m.contains_key(*k)).then_some(())
}

/// Removes a waiter from the table when its wait ends or is cancelled.
struct Unregister<'a> {
    kv: &'a Kv,
    keys: &'a [&'a str],
    w: &'a Arc<Waiter>,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        lock(&self.kv.table).unregister(self.keys, self.w);
    }
}

/// A timer on chorus's background runtime, awaitable from any executor;
/// dropping it cancels it.
#[derive(Debug)]
pub(crate) struct RtSleep(tokio::task::JoinHandle<()>);

impl RtSleep {
    /// Starts a timer of `d`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Runtime`] if the background runtime cannot start.
    pub(crate) fn new(d: Duration) -> Result<Self, StoreError> {
        let h = crate::rt::handle().map_err(StoreError::Runtime)?;
        // The sleep is made on the runtime: making it needs its timer.
        Ok(RtSleep(h.spawn(async move { tokio::time::sleep(d).await })))
    }
}

impl Future for RtSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A JoinError (the runtime shutting down) ends the sleep too.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl Drop for RtSleep {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A store in this process's memory, for single-process use and tests.
///
/// Cloning gives another handle to the same table. Waiting operations are
/// woken by the set that completes them; their timers run on chorus's
/// background runtime, so every method can be awaited from any executor.
#[derive(Clone, Debug, Default)]
pub struct InMemoryStore {
    kv: Arc<Kv>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn kv(&self) -> &Arc<Kv> {
        &self.kv
    }

    /// Reads with `take` now, or waits up to `timeout` for `keys`.
    async fn wait_take<T>(
        &self,
        keys: &[&str],
        timeout: Duration,
        take: impl Fn(&HashMap<String, Vec<u8>>) -> Option<T>,
    ) -> Result<T, StoreError> {
        if let Some(v) = self.kv.try_take(&take) {
            return Ok(v);
        }
        self.kv
            .wait_for(keys, timeout, RtSleep::new(timeout)?, take)
            .await
    }
}

#[async_trait::async_trait]
impl Store for InMemoryStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        wire::check_key(key)?;
        wire::check_value(value)?;
        self.kv.set(key, value.to_vec());
        Ok(())
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        wire::check_key(key)?;
        self.wait_take(&[key], timeout, take_one(key)).await
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        wire::check_key(key)?;
        self.kv.add(key, delta)
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        wire::check_key(key)?;
        wire::check_value(expected)?;
        wire::check_value(desired)?;
        Ok(self.kv.compare_set(key, expected, desired))
    }

    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        self.wait_take(keys, timeout, take_present(keys)).await
    }

    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        Ok(self.kv.check(keys))
    }

    async fn present(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        Ok(self.kv.present(keys))
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        wire::check_key(key)?;
        Ok(self.kv.delete(key))
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        Ok(self.kv.num_keys(""))
    }

    async fn num_keys_with_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        wire::check_key(prefix)?;
        Ok(self.kv.num_keys(prefix))
    }

    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        wire::check_keys(keys.len(), keys.iter().copied())?;
        self.wait_take(keys, timeout, take_all(keys)).await
    }

    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        wire::check_keys(entries.len(), entries.iter().map(|(k, _)| *k))?;
        entries.iter().try_for_each(|(_, v)| wire::check_value(v))?;
        self.kv.multi_set(entries);
        Ok(())
    }
}
