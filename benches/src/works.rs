//! Works registered as the NCCL path registers its ops, without a GPU:
//! the CPU bookkeeping the enqueue breakdowns measure.

/// One device op's CPU bookkeeping without the GPU, as the NCCL path does
/// it: a work registered with one clock reading (registry entry, flight
/// record), completed and dropped. For the enqueue breakdowns of
/// `nccl_bench` (its figures and `--layers`).
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
/// started at `now` (one registry entry, as a batch's ops are); the caller
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
