//! Helpers for tests and benchmarks (feature `test-util`): a one-rank GPU
//! group, GPU kernels of exact length (spin, add-one), stream holds,
//! diagnostic counters of the NCCL path, the serial reduction reference,
//! hooks into the watchdog, and [`SimRank`], a rank's control plane
//! without its data plane.
//!
//! Nothing here is part of the API chorus keeps stable between releases.

use std::sync::Arc;
use std::time::Duration;

pub use chorus_gpu::cuda::kernels::Kernels;
pub use chorus_gpu::cuda::StreamHold;
pub use chorus_gpu::nccl::{
    end_events_created, ended_without_query, in_progress_returns, prewake_counts,
};

pub use crate::reduce::{reference_reduce, Reducible};
pub use crate::sim_rank::{SimError, SimRank};
pub use crate::watchdog::threads::{set_paused, watch};
pub use crate::watchdog::watched::{AsyncErrorCheck, WatchedGroup};

use crate::error::Error;
use crate::process_group::ProcessGroup;
use chorus_store::{InMemoryStore, Store};

/// The op timeout of [`one_rank_group`]: long enough for any test op,
/// short enough that a hung one fails the test.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A one-rank process group named `name` on GPU `device`, with its NCCL
/// communicator created at once, a store of its own and a 60 s op
/// timeout: what single-GPU tests and benchmarks run on.
///
/// # Errors
///
/// No GPU, no NCCL, or the communicator could not be created.
///
/// # Examples
///
/// ```no_run
/// let pg = chorus::test_util::one_rank_group("example", 0)?;
/// assert_eq!(pg.size(), 1);
/// # Ok::<(), chorus::Error>(())
/// ```
pub fn one_rank_group(name: &str, device: usize) -> Result<ProcessGroup, Error> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    futures::executor::block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name(name)
            .device(device)
            .timeout(TIMEOUT)
            .build(),
    )
}
