//! What the reactor watches: [`Pending`], one watched op, and the
//! [`Sleeper`] through which a driver waiter sleeps until its op ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a thread sleeps until an op has ended (see [`Pending::sleeper`]).
pub trait Sleeper: Send + Sync {
    /// Blocks the calling thread, asleep, until the op has ended or failed
    /// (a failure is not reported here: the entry's next poll finds it).
    /// May return earlier when the driver cannot sleep on it; never
    /// returns while the GPU runs otherwise, however long that is. Returns
    /// whether it slept (false: the op had ended already, or the driver
    /// refused).
    fn sleep_until_end(&self) -> bool;
}

/// One watched op.
pub trait Pending: Send + 'static {
    /// Checks the op once, without blocking. When the op has finished (or
    /// failed) it completes its work and returns true; the reactor then drops
    /// the entry. Returns false to be checked again.
    fn poll_complete(&mut self) -> bool;

    /// Where the entry sits in an ordered queue: `(queue, position)`.
    /// Entries of one queue complete in position order (end events recorded
    /// on one stream; entries at one position share one end event), so
    /// while one is pending the reactor skips those at its position or
    /// later in that round: one event query per stream instead of one per
    /// op. `None` (the default): always checked.
    fn order(&self) -> Option<(u64, u64)> {
        None
    }

    /// When the op is expected to end, if an awaiting future should be
    /// woken the lead in force
    /// ([`Reactor::prewake_lead`](crate::reactor::Reactor::prewake_lead))
    /// before it. The default: never.
    fn expected_end(&self) -> Option<Instant> {
        None
    }

    /// Wakes the awaiting future ahead of the expected end (once; after it
    /// [`expected_end`](Self::expected_end) returns `None`). `lead` is the
    /// lead in force
    /// ([`Reactor::prewake_lead`](crate::reactor::Reactor::prewake_lead)):
    /// the future was due to be woken that long before the expected end.
    fn prewake(&mut self, lead: Duration) {
        let _ = lead;
    }

    /// How a thread can sleep until the op ends (in the driver, woken by
    /// the GPU), for an entry someone waits for. Such an entry with an
    /// [`order`](Self::order) is completed by a driver waiter of its queue
    /// (see the module docs), not polled by the reactor thread. `None`
    /// (the default): the reactor thread polls it.
    fn sleeper(&self) -> Option<Arc<dyn Sleeper>> {
        None
    }

    /// True for an entry that needs the reactor thread only at its
    /// pre-wake ([`expected_end`](Self::expected_end)): its op is watched
    /// elsewhere (a driver waiter), and a poll before then asks nothing of
    /// the driver. While every entry is such or expected to end later, the
    /// thread sleeps until the first pre-wake without looking in. The
    /// default: false.
    fn timer_only(&self) -> bool {
        false
    }
}
