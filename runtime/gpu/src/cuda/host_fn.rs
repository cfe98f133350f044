//! Host functions enqueued on a stream (`cuLaunchHostFunc`), for
//! benchmarks that compare ways of learning that GPU work ended.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::error::{driver_error, CudaError};
use super::stream::Stream;

type Callback = Box<dyn FnOnce() + Send + 'static>;

unsafe extern "C" fn trampoline(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Callback>` leaked by `launch_host_fn`,
    // handed to the driver once and run once.
    let f = unsafe { Box::from_raw(data as *mut Callback) };
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Stream {
    /// Runs `f` on a driver thread once the work issued to this stream so
    /// far has completed (`cuLaunchHostFunc`). Work issued later waits for
    /// `f` to return; `f` must not call CUDA.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the driver refuses (then `f` is dropped,
    /// not run).
    pub fn launch_host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<(), CudaError> {
        self.device().bind_to_thread()?;
        let data = Box::into_raw(Box::new(Box::new(f) as Callback)) as *mut c_void;
        // SAFETY: `trampoline` matches CUhostFn and takes back `data`, which
        // stays valid until it runs; the stream is alive.
        let rc = unsafe { sys::cuLaunchHostFunc(self.as_raw(), Some(trampoline), data) };
        if let Err(e) = rc.result() {
            // SAFETY: the driver refused, so it will never run the callback:
            // take the box back and drop it.
            drop(unsafe { Box::from_raw(data as *mut Callback) });
            return Err(driver_error("cuLaunchHostFunc", e));
        }
        Ok(())
    }
}
