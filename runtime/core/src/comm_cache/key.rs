//! Cache keys and cache errors.

use std::fmt;
use std::sync::Arc;

/// What a communicator is cached under (docs/ARCHITECTURE.md,
/// "Communicators").
///
/// * [`Devices`](CommKey::Devices): the device sequence of a collective (one
///   device per participating rank, in rank order).
/// * [`Pair`](CommKey::Pair): the sorted rank pair of a single point-to-point
///   op. Build it with [`CommKey::pair`], which sorts the ranks; the cache
///   sorts a hand-built unsorted pair too, so `Pair { lo: 3, hi: 1 }` and
///   `Pair { lo: 1, hi: 3 }` name the same communicator.
///
/// `Display` writes the key as it appears in store keys and logs: the pair as
/// `"lo:hi"`, a device sequence as its ordinals separated by commas
/// (`"0,1,2"`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommKey {
    /// A collective communicator over this device sequence.
    Devices(Vec<u32>),
    /// A point-to-point communicator between two ranks, `lo <= hi`.
    Pair {
        /// The lower rank.
        lo: usize,
        /// The higher rank.
        hi: usize,
    },
}

impl CommKey {
    /// The key of a collective communicator over `devices`.
    pub fn devices(devices: impl IntoIterator<Item = u32>) -> Self {
        CommKey::Devices(devices.into_iter().collect())
    }

    /// The key of the point-to-point communicator between ranks `a` and `b`,
    /// in either order.
    pub fn pair(a: usize, b: usize) -> Self {
        CommKey::Pair {
            lo: a.min(b),
            hi: a.max(b),
        }
    }

    /// True for a point-to-point (pair) key.
    pub fn is_p2p(&self) -> bool {
        matches!(self, CommKey::Pair { .. })
    }

    /// The same key with a pair's ranks sorted.
    pub(crate) fn normalized(self) -> Self {
        match self {
            CommKey::Pair { lo, hi } => CommKey::pair(lo, hi),
            k => k,
        }
    }
}

impl fmt::Display for CommKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommKey::Pair { lo, hi } => write!(f, "{lo}:{hi}"),
            CommKey::Devices(devs) => {
                for (i, d) in devs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why the cache could not hand out a communicator.
///
/// Cloneable: every caller waiting on one initialization gets the same error.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommCacheError<E> {
    /// The factory failed to create the communicator. Nothing was cached: the
    /// next use of the key starts a new initialization (with a new store key
    /// for a collective key, so every rank must retry together).
    #[error("group '{group}': initializing the communicator for key {key} (store key '{store_key}') failed: {cause}")]
    Init {
        /// The group whose cache it is.
        group: Arc<str>,
        /// The key that was being initialized.
        key: CommKey,
        /// The store key its unique id was exchanged under.
        store_key: String,
        /// The factory's error.
        cause: E,
    },
    /// The group's communicators were aborted; this key is not usable any
    /// more and is never re-initialized silently. Create a new group.
    #[error("group '{group}': the communicator for key {key} is aborted ({reason}); create a new group to continue")]
    Aborted {
        /// The group whose cache it is.
        group: Arc<str>,
        /// The key that was asked for.
        key: CommKey,
        /// Why the group was aborted.
        reason: Arc<str>,
    },
    /// The factory panicked while creating the communicator (a bug in the
    /// backend). Nothing was cached; the next use retries.
    #[error("group '{group}': initializing the communicator for key {key} panicked; this is a bug in the backend, please report it")]
    InitPanicked {
        /// The group whose cache it is.
        group: Arc<str>,
        /// The key that was being initialized.
        key: CommKey,
    },
}

impl<E> CommCacheError<E> {
    /// The key the error is about.
    pub fn key(&self) -> &CommKey {
        match self {
            CommCacheError::Init { key, .. }
            | CommCacheError::Aborted { key, .. }
            | CommCacheError::InitPanicked { key, .. } => key,
        }
    }

    /// True if the error says the communicator (or the whole cache) was
    /// aborted.
    pub fn is_aborted(&self) -> bool {
        matches!(self, CommCacheError::Aborted { .. })
    }
}
