//! [`NcclOptions`]: the settings of a group's NCCL backend.

use std::time::Duration;

use chorus_gpu::cuda::StreamPriority;

/// Settings of a group's NCCL backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclOptions {
    /// Priority of each communicator's dedicated stream (default: the
    /// device's normal priority; `Highest` keeps collectives from being
    /// starved by compute kernels).
    pub stream_priority: StreamPriority,
    /// Run ops on a blocking twin of each group communicator (default true;
    /// `CHORUS_NCCL_BLOCKING=0` turns it off, see `NcclOptions::from_env`). Communicators are created
    /// non-blocking, so that initialization has a timeout and can be
    /// aborted; ops on a non-blocking communicator of several ranks return
    /// `ncclInProgress` and must be polled on every call, so after
    /// initialization chorus splits a blocking twin (same ranks) and issues
    /// ops there. A twin that cannot be made within the group's
    /// timeout fails the initialization. Subgroup communicators split by
    /// `new_group` stay non-blocking.
    pub blocking_ops: bool,
    /// How long the first poll of a device work may watch the op's end
    /// event itself before it hands the op to the completion reactor
    /// (default 10 µs, at most 1 ms; zero turns it off): a small op
    /// finishes within that, and resolving it on the polling thread saves
    /// the park and wake-up of the awaiting thread.
    /// `CHORUS_POLL_SPIN_US` sets it from the environment.
    pub poll_spin: Duration,
    /// How a group re-formed after losing ranks gets its NCCL communicator
    /// (default [`ReformComms::Fresh`]; `CHORUS_NCCL_REFORM=shrink|fresh`).
    /// [`ReformComms::Shrink`] also makes an abort keep the group's
    /// collective communicator (revoked with `ncclCommRevoke` where NCCL
    /// has it) rather than destroy it, to shrink it later.
    pub reform: ReformComms,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            stream_priority: StreamPriority::default(),
            blocking_ops: true,
            poll_spin: Duration::from_micros(10),
            reform: ReformComms::default(),
        }
    }
}

/// How a re-formed group gets its NCCL communicator when only ranks were
/// lost (`NcclOptions::reform`, `CHORUS_NCCL_REFORM`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReformComms {
    /// Shrink the old group's communicator (`ncclCommShrink` of the
    /// communicator kept and revoked at the failure: NCCL 2.28.7 or later,
    /// with `ncclCommRevoke`), and initialize a fresh one where that is not
    /// possible (an older NCCL, a revoke that failed, a member that cannot).
    /// A group that ranks joined always gets a fresh one.
    Shrink,
    /// A fresh communicator with a new unique id, at the new group's first
    /// device op (lazily, as for a new group).
    #[default]
    Fresh,
}

impl ReformComms {
    /// `shrink` or `fresh` (`CHORUS_NCCL_REFORM`).
    pub(crate) fn parse(s: &str) -> Option<ReformComms> {
        match s.trim() {
            "shrink" => Some(ReformComms::Shrink),
            "fresh" => Some(ReformComms::Fresh),
            _ => None,
        }
    }
}
