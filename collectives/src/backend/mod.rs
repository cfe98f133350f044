//! Backends: what runs an op once the [`ProcessGroup`](crate::ProcessGroup)
//! has validated it and registered its work.
//!
//! A backend receives [`OpRequest`]s in program order through
//! [`Backend::submit`], which must not block, runs them in that order, and
//! completes each request's completer with the buffers it was given.

use std::fmt;
use std::time::Duration;

use chorus_core::flight_recorder::OpMeta;
use chorus_core::{Completer, OpContext, WorkError};

use crate::dtype::{HostBuffer, ReduceOp};

pub(crate) mod nccl;
pub(crate) mod tcp;

/// What an op asks its backend to do. Buffers are moved in and come back, in
/// the same order, in the op's output.
#[derive(Debug)]
pub(crate) enum OpKind {
    /// In place: every rank ends with the reduction of all ranks' `buf`.
    AllReduce { buf: HostBuffer, op: ReduceOp },
    /// In place: every rank ends with `root`'s `buf`.
    Broadcast { buf: HostBuffer, root: usize },
    /// In place on `root` (the other ranks' buffers come back unchanged).
    Reduce {
        buf: HostBuffer,
        root: usize,
        op: ReduceOp,
    },
    /// `output` (len = size * input.len()) receives every rank's `input` in
    /// rank order.
    AllGather {
        input: HostBuffer,
        output: HostBuffer,
    },
    /// `input` (len = size * output.len()) is reduced across ranks; rank r
    /// gets block r in `output`.
    ReduceScatter {
        input: HostBuffer,
        output: HostBuffer,
        op: ReduceOp,
    },
    /// `input` and `output` have size * k elements; block j of rank i's input
    /// goes to block i of rank j's output.
    AllToAll {
        input: HostBuffer,
        output: HostBuffer,
    },
    /// Sends `buf` to `peer`; `buf` comes back.
    Send { buf: HostBuffer, peer: usize },
    /// Receives into `buf` (its length must match the sender's) from `peer`.
    Recv { buf: HostBuffer, peer: usize },
    /// Completes when every rank has entered it.
    Barrier,
}

impl OpKind {
    /// The op's name as it appears in errors and traces.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            OpKind::AllReduce { .. } => "all_reduce",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Reduce { .. } => "reduce",
            OpKind::AllGather { .. } => "all_gather",
            OpKind::ReduceScatter { .. } => "reduce_scatter",
            OpKind::AllToAll { .. } => "all_to_all",
            OpKind::Send { .. } => "send",
            OpKind::Recv { .. } => "recv",
            OpKind::Barrier => "barrier",
        }
    }
}

impl OpKind {
    /// What the flight recorder keeps of the op: dtype, (input) count, and
    /// root or peer.
    pub(crate) fn meta(&self) -> OpMeta {
        let (buf, peer) = match self {
            OpKind::AllReduce { buf, .. } => (Some(buf), None),
            OpKind::Broadcast { buf, root } | OpKind::Reduce { buf, root, .. } => {
                (Some(buf), Some(*root))
            }
            OpKind::Send { buf, peer } | OpKind::Recv { buf, peer } => (Some(buf), Some(*peer)),
            OpKind::AllGather { input, .. }
            | OpKind::ReduceScatter { input, .. }
            | OpKind::AllToAll { input, .. } => (Some(input), None),
            OpKind::Barrier => (None, None),
        };
        OpMeta {
            dtype: buf.map(|b| std::borrow::Cow::Borrowed(b.dtype().name())),
            count: buf.map_or(0, |b| b.len() as u64),
            peer,
        }
    }

    /// The op's buffers, in the order they came in (what a finished op
    /// hands back, and what a refused op gives back).
    pub(crate) fn into_buffers(self) -> OpOutput {
        match self {
            OpKind::AllReduce { buf, .. }
            | OpKind::Broadcast { buf, .. }
            | OpKind::Reduce { buf, .. }
            | OpKind::Send { buf, .. }
            | OpKind::Recv { buf, .. } => vec![buf],
            OpKind::AllGather { input, output }
            | OpKind::ReduceScatter { input, output, .. }
            | OpKind::AllToAll { input, output } => vec![input, output],
            OpKind::Barrier => Vec::new(),
        }
    }

    /// True for ops every rank of the group takes part in.
    pub(crate) fn is_collective(&self) -> bool {
        !matches!(self, OpKind::Send { .. } | OpKind::Recv { .. })
    }
}

/// The buffers of a finished op, in the order they were given.
pub(crate) type OpOutput = Vec<HostBuffer>;

/// One op handed to a backend.
#[derive(Debug)]
pub(crate) struct OpRequest {
    /// Rank, group, sequence number and op name. For collectives `seq` is
    /// the group's collective sequence number (equal on every rank for the
    /// same call); for send/recv it is the number of the message between
    /// this pair in this direction (the n-th send from a to b matches the
    /// n-th recv on b from a).
    pub(crate) ctx: OpContext,
    pub(crate) kind: OpKind,
    /// How long the op may take once it starts running.
    pub(crate) timeout: Duration,
    pub(crate) completer: Completer<OpOutput>,
}

/// A backend of a process group.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// Short name, e.g. `"tcp"`.
    fn name(&self) -> &'static str;

    /// Queues `req`; runs ops in submission order; never blocks the caller.
    /// Arguments were validated by the process group (lengths, roots, peers,
    /// dtypes), but the backend checks what only the wire can tell (the other
    /// ranks' op, dtype and count).
    fn submit(&self, req: OpRequest);

    /// Queues the ops of a group (see [`Group`](crate::Group)), which run
    /// as one, in order. The default runs them as separate ops.
    fn submit_group(&self, reqs: Vec<OpRequest>) {
        for r in reqs {
            self.submit(r);
        }
    }

    /// Closes the backend gracefully at the end of a job: tells every peer
    /// goodbye and waits (bounded) until every peer has said goodbye too, so
    /// that no rank exits while another still reads what it sent. Ops
    /// submitted afterwards fail.
    fn close(&self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    /// Tears the backend down after a failure: close connections, stop the
    /// worker. Pending and later requests fail; buffers of ops still in
    /// flight are released only when the worker lets go of them.
    fn abort(&self, cause: &WorkError);
}
