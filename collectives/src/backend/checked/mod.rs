//! The checked mode on device ops ([`GroupBuilder::check_ops`](crate::GroupBuilder::check_ops)):
//! NCCL compares nothing across ranks, so before a device collective (or a
//! group or coalesced launch of them) reaches NCCL, every rank's
//! signatures — op, dtype, count, root, reduction of each op — are gathered
//! through the group's TCP backend and compared. A launch the ranks called
//! differently is refused on every rank with [`WorkError::Mismatch`] naming
//! both sides, before anything reaches NCCL, so it neither hangs nor
//! corrupts; the group stays usable (nothing ran, and every rank refused
//! the same launch).
//!
//! The exchange is one of chorus's own ops (`check`, numbered apart from
//! the program's ops): an all_gather of two numbers per rank (how many ops,
//! a digest of their signatures), and only when the digests differ, a
//! second one of the signatures themselves, to name both sides. The
//! submitting thread waits for it under the group's submission lock, so
//! launches keep their program order; its cost per op is in
//! benches/RESULTS.md.
//!
//! Files: `signature` (what the ranks compare of an op, and how a mismatch
//! reads), `checker` (the exchange and the comparison).

mod checker;
mod signature;

pub(crate) use checker::Checker;
pub(crate) use signature::signature_of;

#[cfg(test)]
mod tests;
