//! Ranks of one group as tasks of this process.

use std::sync::Arc;
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::{GroupBuilder, ProcessGroup, TcpOptions};

/// Builds `size` ranks of one group as tasks of this process, over loopback,
/// sharing one in-memory store.
pub async fn local_groups(size: usize, timeout: Duration) -> Vec<ProcessGroup> {
    local_groups_with(size, timeout, TcpOptions::default()).await
}

/// [`local_groups`] with TCP options.
pub async fn local_groups_with(
    size: usize,
    timeout: Duration,
    tcp: TcpOptions,
) -> Vec<ProcessGroup> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    build_all(size, |rank| {
        member(rank, size, &store, timeout).tcp_options(tcp.clone())
    })
    .await
}

/// Builds `size` ranks of one group as tasks of this process on `store`
/// (which the test keeps, to make more groups or joiners on it).
pub async fn local_groups_on(
    size: usize,
    store: &Arc<dyn Store>,
    timeout: Duration,
) -> Vec<ProcessGroup> {
    build_all(size, |rank| member(rank, size, store, timeout)).await
}

/// The builder of rank `rank` of a group of `size` on `store`.
fn member(rank: usize, size: usize, store: &Arc<dyn Store>, timeout: Duration) -> GroupBuilder {
    ProcessGroup::builder()
        .rank(rank)
        .world_size(size)
        .store(store.clone())
        .timeout(timeout)
}

/// Builds the `size` ranks' groups that `builder(rank)` describes, each
/// in a task of its own, and returns them by rank.
///
/// # Panics
///
/// If a rank's setup fails: test helper only.
pub async fn build_all(size: usize, builder: impl Fn(usize) -> GroupBuilder) -> Vec<ProcessGroup> {
    let handles: Vec<_> = (0..size)
        .map(|rank| tokio::spawn(builder(rank).build()))
        .collect();
    let mut groups = Vec::new();
    for h in handles {
        groups.push(h.await.expect("rank task").expect("group setup"));
    }
    groups
}

/// Runs `f(group)` on every rank concurrently and returns the results by
/// rank.
pub async fn on_all<F, Fut, R>(groups: &[ProcessGroup], f: F) -> Vec<R>
where
    F: Fn(ProcessGroup) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let handles: Vec<_> = groups.iter().map(|g| tokio::spawn(f(g.clone()))).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("rank task panicked"));
    }
    out
}
