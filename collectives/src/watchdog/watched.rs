//! What the watchdog knows of a group it watches ([`WatchedGroup`]).

use std::sync::{Arc, Weak};

use chorus_core::Registry;

use super::config::ErrorPolicy;

/// A backend's asynchronous error check (NCCL: `ncclCommGetAsyncError` on
/// each communicator). Returns the error text if the backend has failed.
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub type AsyncErrorCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A group the watchdog watches.
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct WatchedGroup {
    /// Group name.
    pub name: Arc<str>,
    /// This process's rank in the group.
    pub rank: usize,
    /// Number of ranks in the group.
    pub size: usize,
    /// The group's registry; the watchdog forgets the group once it is gone.
    pub registry: Weak<Registry>,
    /// What to do on timeout or error.
    pub policy: ErrorPolicy,
    /// The backend's asynchronous error check, if it has one.
    pub check: Option<AsyncErrorCheck>,
}

impl std::fmt::Debug for WatchedGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedGroup")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("policy", &self.policy)
            .finish()
    }
}
