//! What a group's publisher, watcher and [`ErrorPropagation`] handle
//! share.
//!
//! [`ErrorPropagation`]: super::ErrorPropagation

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use chorus_store::Store;

/// The state of one group's propagation on this rank.
pub(super) struct Shared {
    pub(super) store: Arc<dyn Store>,
    pub(super) key: String,
    pub(super) group: Arc<str>,
    pub(super) rank: usize,
    /// Ranks of the group besides this one (acknowledgements to wait for).
    pub(super) peers: usize,
    pub(super) stopped: AtomicBool,
    /// Signalled when the publish in flight is done.
    pub(super) publishing: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    pub(super) watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}
