//! What a failed rank publishes ([`RemoteFailure`]), and under which
//! store keys.

use chorus_core::WorkError;
use serde::{Deserialize, Serialize};

/// The store key (inside the group's namespace) under which a group's
/// failure is published.
pub(crate) fn key(epoch: u64) -> String {
    format!("error/{epoch}")
}

/// What a failed rank publishes for its peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFailure {
    /// The rank (in the group) that detected the failure.
    pub origin_rank: usize,
    /// Sequence number of its failed op (0 if the failure belongs to no op).
    pub seq: u64,
    /// Its failed op, e.g. `"all_reduce"`.
    pub op: String,
    /// The error's kind ([`WorkError::kind`]), e.g. `"OpTimeout"`.
    pub kind: String,
    /// The error's full message.
    pub cause: String,
}

impl RemoteFailure {
    /// The failure `err` of rank `origin_rank`.
    pub(crate) fn new(origin_rank: usize, err: &WorkError) -> RemoteFailure {
        let ctx = err.context();
        RemoteFailure {
            origin_rank,
            seq: ctx.seq,
            op: ctx.op.to_string(),
            kind: err.kind().to_string(),
            cause: err.to_string(),
        }
    }
}

/// The acknowledgement counter of the published failure.
pub(super) fn ack_key(key: &str) -> String {
    format!("{key}/acks")
}
