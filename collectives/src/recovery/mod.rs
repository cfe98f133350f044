//! Re-forming a group after a failure: [`ProcessGroup::reform`](crate::ProcessGroup::reform).
//!
//! * `quorum`: the I/O-free state machine of the quorum (who is in the new
//!   epoch), with its [`Roster`].
//! * `store_io`: drives it through the job's store.
//! * `reform`: the method itself (abort the old group, run the quorum,
//!   connect the new group).

mod quorum;
mod reform;
mod store_io;

pub use crate::error::ReformError;
pub use quorum::Roster;

#[cfg(test)]
mod tests;
