//! chorus's own background I/O runtime.
//!
//! Store connections and TCP-backend workers run here, on threads chorus
//! owns, never on the caller's executor: the futures chorus returns can be
//! awaited under any executor (tokio, smol, `futures::executor::block_on`),
//! and a blocked user executor cannot stop I/O or error detection.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

thread_local! {
    /// Set on chorus's own I/O threads.
    static IO_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on one of chorus's I/O threads: code that would otherwise spin
/// there waiting for I/O (which those very threads must do) leaves the
/// waiting to them.
pub fn on_io_thread() -> bool {
    IO_THREAD.with(std::cell::Cell::get)
}
static CONFIGURED: OnceLock<usize> = OnceLock::new();

/// Sets the number of I/O threads (the builder equivalent of
/// `CHORUS_IO_THREADS`; at least 1). Takes effect only before the runtime
/// first starts; returns false if it already runs or was configured.
pub fn configure(io_threads: usize) -> bool {
    RUNTIME.get().is_none() && CONFIGURED.set(io_threads.max(1)).is_ok()
}

/// Number of I/O worker threads: what [`configure`] set, else
/// `CHORUS_IO_THREADS`, or by default one per core this process has to
/// itself (cores ÷ `LOCAL_WORLD_SIZE`, as set by `chorus-run` and
/// torchrun), at least 1 and at most 2.
fn io_threads() -> usize {
    CONFIGURED
        .get()
        .copied()
        .or_else(crate::config::io_threads)
        .unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            default_io_threads(cores, local_ranks().unwrap_or(1))
        })
}

/// How many ranks of the job run on this host, as its launcher says
/// (`LOCAL_WORLD_SIZE`, set by chorus-run and torchrun); `None` when unset.
/// What each rank's threads can count on having to themselves.
pub fn local_ranks() -> Option<usize> {
    std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
}

/// The default I/O thread count for `local` ranks sharing `cores` cores.
/// A second thread only pays where it has a core of its own: on a shared
/// core every op hands its task from one thread to the other (a futex
/// wake-up) before it sends.
fn default_io_threads(cores: usize, local: usize) -> usize {
    (cores / local.max(1)).clamp(1, 2)
}

/// The background runtime's handle, started on first use.
///
/// # Errors
///
/// The OS error text if the runtime's threads could not be started.
pub fn handle() -> Result<Handle, String> {
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(io_threads())
                .thread_name("chorus-io")
                .on_thread_start(|| IO_THREAD.with(|t| t.set(true)))
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start chorus I/O threads: {e}"))
        })
        .as_ref()
        .map(|rt| rt.handle().clone())
        .map_err(Clone::clone)
}

/// Runs `fut` on the background runtime and awaits its output from any
/// executor.
///
/// # Errors
///
/// The OS error text if the runtime could not start, or if the task
/// panicked.
pub async fn run<F>(fut: F) -> Result<F::Output, String>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let h = handle()?;
    h.spawn(fut)
        .await
        .map_err(|e| format!("chorus I/O task failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::default_io_threads;

    #[test]
    fn io_threads_follow_the_cores_each_local_rank_has() {
        assert_eq!(default_io_threads(2, 2), 1);
        assert_eq!(default_io_threads(2, 4), 1);
        assert_eq!(default_io_threads(2, 1), 2);
        assert_eq!(default_io_threads(16, 4), 2);
        assert_eq!(default_io_threads(16, 8), 2);
        assert_eq!(default_io_threads(16, 16), 1);
        assert_eq!(default_io_threads(1, 0), 1);
    }
}
