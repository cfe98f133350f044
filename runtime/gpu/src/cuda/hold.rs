//! Holding a stream at a point until the host releases it: deterministic
//! "the GPU has not finished yet" for tests, without spin kernels or timing.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::error::{driver_error, CudaError};
use super::stream::Stream;

struct HoldState {
    released: AtomicBool,
    reached: AtomicBool,
    timed_out: AtomicBool,
    max: Duration,
}

/// A point in a stream where the stream waits until this guard is released
/// or dropped. Work issued to the stream after [`Stream::hold`] does not run
/// before that, so events recorded after it are reliably not complete.
///
/// The hold is a host function (`cuLaunchHostFunc`) that waits on a flag; it
/// gives up by itself after the `max` given to [`Stream::hold`], so a leaked
/// guard cannot hang the stream forever. While it waits it occupies the
/// driver's callback thread: other host functions of the process wait too.
/// For tests only.
#[must_use = "the stream stays held until this guard is released or dropped"]
pub struct StreamHold {
    state: Arc<HoldState>,
}

impl std::fmt::Debug for StreamHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamHold")
            .field("reached", &self.is_reached())
            .field("timed_out", &self.timed_out())
            .finish()
    }
}

impl StreamHold {
    /// Lets the stream go on.
    pub fn release(self) {
        drop(self);
    }

    /// Whether the stream has reached the hold (all work before it is done).
    pub fn is_reached(&self) -> bool {
        self.state.reached.load(Ordering::Acquire)
    }

    /// Whether the hold gave up waiting because `max` passed.
    pub fn timed_out(&self) -> bool {
        self.state.timed_out.load(Ordering::Acquire)
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.state.released.store(true, Ordering::Release);
    }
}

/// The host function: waits until released or `max` passes.
///
/// # Safety
///
/// `user` must come from `Arc::into_raw` of a `HoldState`, passed to exactly
/// one call of this function.
unsafe extern "C" fn hold_here(user: *mut c_void) {
    // SAFETY: per the contract, `user` is an `Arc<HoldState>` leaked by
    // `Stream::hold` for this call alone; we take that reference back.
    let state = unsafe { Arc::from_raw(user as *const HoldState) };
    state.reached.store(true, Ordering::Release);
    let deadline = Instant::now() + state.max;
    while !state.released.load(Ordering::Acquire) {
        if Instant::now() >= deadline {
            state.timed_out.store(true, Ordering::Release);
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

impl Stream {
    /// Holds the stream at this point until the returned guard is released
    /// or dropped, or `max` has passed. For tests.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when `cuLaunchHostFunc` fails.
    pub fn hold(&self, max: Duration) -> Result<StreamHold, CudaError> {
        let state = Arc::new(HoldState {
            released: AtomicBool::new(false),
            reached: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
            max,
        });
        self.device().bind_to_thread()?;
        let user = Arc::into_raw(state.clone()) as *mut c_void;
        // SAFETY: the stream is alive; `hold_here` matches CUhostFn and
        // receives `user` exactly once, which it turns back into the Arc.
        let rc = unsafe { sys::cuLaunchHostFunc(self.as_raw(), Some(hold_here), user) };
        if let Err(e) = rc.result() {
            // SAFETY: the launch failed, so `hold_here` will never run and we
            // still own the reference leaked above.
            drop(unsafe { Arc::from_raw(user as *const HoldState) });
            return Err(driver_error("cuLaunchHostFunc", e));
        }
        Ok(StreamHold { state })
    }
}
