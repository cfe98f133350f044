//! Recycled receive buffers of the TCP backend.

use chorus_core::sync::lock;
use std::sync::{Arc, Mutex};

/// Recycled receive buffers, so that steady-state ops allocate nothing per
/// chunk. Buffers are `u64`-backed, so their bytes are aligned for every
/// dtype.
#[derive(Debug)]
pub(super) struct Pool {
    bufs: Mutex<Vec<Vec<u64>>>,
    /// How many idle buffers are kept.
    keep: usize,
}

impl Pool {
    pub(super) fn new(keep: usize) -> Arc<Pool> {
        Arc::new(Pool {
            bufs: Mutex::new(Vec::new()),
            keep,
        })
    }

    /// A buffer of `len` bytes (contents unspecified).
    pub(super) fn get(self: &Arc<Self>, len: usize) -> PoolBuf {
        let mut words = lock(&self.bufs).pop().unwrap_or_default();
        let need = len.div_ceil(8);
        if words.len() < need {
            words.resize(need, 0);
        }
        PoolBuf {
            words,
            len,
            pool: self.clone(),
        }
    }

    fn put(&self, words: Vec<u64>) {
        let mut bufs = lock(&self.bufs);
        if bufs.len() < self.keep {
            bufs.push(words);
        }
    }
}

/// A buffer from the [`Pool`]; goes back to it when dropped.
pub(super) struct PoolBuf {
    words: Vec<u64>,
    len: usize,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PoolBuf({} bytes)", self.len)
    }
}

impl PoolBuf {
    pub(super) fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if self.words.capacity() > 0 {
            self.pool.put(std::mem::take(&mut self.words));
        }
    }
}
