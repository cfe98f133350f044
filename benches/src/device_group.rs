//! The one-rank GPU group the single-GPU benches measure.

/// A 1-rank process group on GPU `device` (communicator created eagerly),
/// with a store of its own: what the single-GPU benches measure.
///
/// # Errors
///
/// No GPU, no NCCL, or the communicator could not be created.
pub fn one_rank_device_group(
    name: &str,
    device: usize,
) -> Result<chorus::ProcessGroup, chorus::Error> {
    let store: std::sync::Arc<dyn chorus_store::Store> =
        std::sync::Arc::new(chorus_store::InMemoryStore::new());
    futures::executor::block_on(
        chorus::ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name(name)
            .device(device)
            .build(),
    )
}
