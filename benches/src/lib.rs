//! Benchmark support code.
#![forbid(unsafe_code)]
pub mod store;

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

/// Takes every buffer left in `slots`, submits each with `submit` and
/// keeps what it returns in a vector made to size (`n`), as the raw loops
/// it is compared with keep nothing: the submission loop of the grouped
/// and one-by-one benches.
pub fn submit_each<B, W>(
    slots: &mut [Option<B>],
    n: usize,
    submit: impl FnMut(B) -> Option<W>,
) -> Vec<W> {
    let mut works = Vec::with_capacity(n);
    works.extend(slots.iter_mut().filter_map(Option::take).filter_map(submit));
    works
}

/// One device op's CPU bookkeeping without the GPU, as the NCCL path does
/// it: a work registered with one clock reading (registry entry, flight
/// record), completed and dropped. For the enqueue breakdowns of
/// `nccl_bench` and `enqueue_probe`.
///
/// # Errors
///
/// The registry refuses new works once its group failed.
pub fn work_bookkeeping_round(
    registry: &std::sync::Arc<chorus_core::Registry>,
    group: &std::sync::Arc<str>,
    seq: u64,
) -> Result<(), chorus_core::WorkError> {
    let (w, c) = started_work(registry, group, seq, std::time::Instant::now())?;
    c.complete(Ok(1));
    drop(w);
    Ok(())
}

/// A work registered as a started all_reduce at `now` (60 s timeout), as
/// the NCCL path registers its ops; the caller completes it.
///
/// # Errors
///
/// The registry refuses new works once its group failed.
pub fn started_work(
    registry: &std::sync::Arc<chorus_core::Registry>,
    group: &std::sync::Arc<str>,
    seq: u64,
    now: std::time::Instant,
) -> Result<(chorus_core::OpFuture<u32>, chorus_core::Completer<u32>), chorus_core::WorkError> {
    let ctx = chorus_core::OpContext {
        rank: 0,
        group: group.clone(),
        seq,
        op: "all_reduce",
        internal: None,
    };
    chorus_core::OpFuture::<u32>::new_started(
        ctx,
        registry,
        now,
        Some(std::time::Duration::from_secs(60)),
        true,
        Default::default(),
        None,
    )
}

/// The works of `n` all_reduces from `seq` on, registered as one batch
/// started at `now` (one registry entry, as a group's ops are); the caller
/// completes them.
///
/// # Errors
///
/// The registry refuses new works once its group failed.
#[allow(clippy::type_complexity)]
pub fn started_batch(
    registry: &std::sync::Arc<chorus_core::Registry>,
    group: &std::sync::Arc<str>,
    seq: u64,
    n: usize,
    now: std::time::Instant,
) -> Result<Vec<(chorus_core::OpFuture<u32>, chorus_core::Completer<u32>)>, chorus_core::WorkError>
{
    let ctx = |seq| chorus_core::OpContext {
        rank: 0,
        group: group.clone(),
        seq,
        op: "all_reduce",
        internal: None,
    };
    chorus_core::WorkBatch::register(
        registry,
        &ctx(seq),
        n,
        now,
        Some(std::time::Duration::from_secs(60)),
        None,
        |b| {
            (seq..seq + n as u64)
                .map(|s| b.add(ctx(s), true, Default::default()))
                .collect()
        },
    )
    .map(|(works, _)| works)
}

/// Prints the enqueue phases' medians of the ops profiled so far, when
/// `CHORUS_NCCL_PROFILE=1` (see `chorus_core::profile`).
pub fn print_profile() {
    let (phases, n) = chorus_core::profile::medians();
    if n > 0 {
        println!(
            "profile (CHORUS_NCCL_PROFILE=1), median over {n} ops (each stamp adds ~0.03 us):"
        );
        for (name, us) in chorus_core::profile::PHASES.iter().zip(phases) {
            println!("  {name:<58} {us:6.3} us");
        }
    }
}
