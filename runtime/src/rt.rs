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

/// Number of I/O worker threads (`CHORUS_IO_THREADS`, default 2).
fn io_threads() -> usize {
    std::env::var("CHORUS_IO_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2)
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
