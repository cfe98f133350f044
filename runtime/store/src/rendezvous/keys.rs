//! The rendezvous's keys in the job's store, the value of an abandoned
//! join, and which ranks have not set their key.

use crate::error::StoreError;
use crate::store::Store;

pub(super) const K_WORLD: &str = "chorus/rdzv/world_size";
pub(super) const K_JOINED: &str = "chorus/rdzv/joined";
pub(super) const K_ALL_JOINED: &str = "chorus/rdzv/all_joined";
pub(super) const K_LEFT: &str = "chorus/rdzv/left";
pub(super) const K_ALL_LEFT: &str = "chorus/rdzv/all_left";

pub(super) fn rank_key(rank: usize) -> String {
    format!("chorus/rdzv/rank/{rank}")
}

pub(super) fn abort_ack_key(rank: usize) -> String {
    format!("chorus/rdzv/abort_ack/{rank}")
}

/// Value of `all_joined` when rank 0 gave up, followed by the missing ranks.
pub(super) const ABORT: &str = "abort ";

pub(super) fn join_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn parse_list(list: &[u8]) -> Vec<usize> {
    String::from_utf8_lossy(list)
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect()
}

pub(super) fn left_key(rank: usize) -> String {
    format!("chorus/rdzv/left/{rank}")
}

/// The ranks in `0..world` whose key `key(r)` does not exist.
pub(super) async fn absent(
    client: &dyn Store,
    world: usize,
    key: fn(usize) -> String,
) -> Result<Vec<usize>, StoreError> {
    // One request for the lot where the store can (`Store::present`).
    let keys: Vec<String> = (0..world).map(key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let present = client.present(&refs).await?;
    Ok((0..world)
        .filter(|&r| !present.get(r).copied().unwrap_or(false))
        .collect())
}
