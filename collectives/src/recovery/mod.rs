//! Re-forming a group after a failure: [`ProcessGroup::reform`](crate::ProcessGroup::reform).
//!
//! * `quorum`: the I/O-free state machine of the quorum (who is in the new
//!   epoch), with its [`Roster`].
//! * `store_io`: drives it through the job's store.
//! * `reform`: the method itself (abort the old group, run the quorum,
//!   connect the new group).
//! * `joiner`: the I/O-free state machine of a replacement rank joining
//!   an epoch; `rejoin` drives it over the epochs until one admits it.
//! * `admit`: [`ProcessGroup::admit`](crate::ProcessGroup::admit), the
//!   members letting joiners in at a step boundary.

mod admit;
mod joiner;
pub(crate) mod quorum;
mod reform;
pub(crate) mod rejoin;
pub(crate) mod store_io;

pub use crate::error::ReformError;
pub use quorum::Roster;

#[cfg(test)]
mod tests;
