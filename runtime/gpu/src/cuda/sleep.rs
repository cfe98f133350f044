//! Sleeping until an event completes: the calling thread blocks in the
//! driver, woken by the GPU's signal, with no spinning and no timer
//! (docs/ARCHITECTURE.md, "Waking on time").
//!
//! `cuEventSynchronize` sleeps only on an event made with
//! `CU_EVENT_BLOCKING_SYNC`; on any other it spins. An op's end event is an
//! ordinary one: recording it costs the enqueue nothing more, and the GPU
//! signals the host only for the events a thread sleeps on. So to sleep on
//! an ordinary event, the calling thread has a side stream per device that
//! waits on it (`cuStreamWaitEvent`) and records a blocking-sync event of
//! its own after the wait, and synchronizes on that one: two more driver
//! calls for the thread that sleeps, none on the enqueue path.

use std::cell::RefCell;

use super::device::{Device, StreamPriority};
use super::error::CudaError;
use super::event::Event;
use super::stream::Stream;

/// A thread's side stream and blocking-sync event on one device.
struct Side {
    device: usize,
    stream: Stream,
    signal: Event,
}

thread_local! {
    static SIDES: RefCell<Vec<Side>> = const { RefCell::new(Vec::new()) };
}

/// Blocks the calling thread, asleep, until `event` (of `device`) has
/// completed. There is no timeout: the caller must be a thread that may
/// wait as long as the GPU runs (never a caller's or an executor's thread).
///
/// # Errors
///
/// The CUDA error of the calls (an error of the captured work, which the
/// driver reports here, or a failure to make the side stream).
pub(crate) fn sleep_until(event: &Event, device: &Device) -> Result<(), CudaError> {
    if event.is_blocking() {
        return event.synchronize();
    }
    SIDES.with(|sides| {
        let mut sides = sides.borrow_mut();
        let i = match sides.iter().position(|s| s.device == device.ordinal()) {
            Some(i) => i,
            None => {
                let stream = device.new_stream(StreamPriority::Normal)?;
                let signal = device.new_blocking_event()?;
                sides.push(Side {
                    device: device.ordinal(),
                    stream,
                    signal,
                });
                sides.len() - 1
            }
        };
        let side = &sides[i];
        device.bind_to_thread()?;
        side.stream.wait_event_bound(event)?;
        side.signal.record_bound(&side.stream)?;
        side.signal.synchronize()
    })
}

/// Lets go of the calling thread's side streams and events (a thread that
/// slept calls it before it ends): destroyed while `driver_usable`, else
/// left as they are (the process is exiting and the driver may be gone).
pub(crate) fn release_side_streams(driver_usable: bool) {
    let sides = SIDES.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if driver_usable {
        drop(sides);
    } else {
        std::mem::forget(sides);
    }
}
