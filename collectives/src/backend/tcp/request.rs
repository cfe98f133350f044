//! [`OpRequest`]: one op as the TCP backend's worker receives it.

use std::time::Duration;

use chorus_core::{Completer, HostBuffer, Op, OpContext};

/// One op handed to the TCP backend. Its buffers come back, in the same
/// order, in the op's output.
#[derive(Debug)]
pub(super) struct OpRequest {
    /// Rank, group, sequence number and op name. For collectives `seq` is
    /// the group's collective sequence number (equal on every rank for the
    /// same call); for send/recv it is the number of the message between
    /// this pair in this direction (the n-th send from a to b matches the
    /// n-th recv on b from a).
    pub(super) ctx: OpContext,
    /// What to do; ranks are group ranks.
    pub(super) op: Op,
    /// The op's buffers, as [`Op::buffers`] counts them (checked by the
    /// group against [`Op::check`]).
    pub(super) bufs: Vec<HostBuffer>,
    /// How long the op may take once it starts running.
    pub(super) timeout: Duration,
    pub(super) completer: Completer<Vec<HostBuffer>>,
}
