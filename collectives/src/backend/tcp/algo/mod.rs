//! The algorithms of the TCP backend (see the table in the module docs of
//! [`tcp`](super)): schedules that say which peer gets which block when
//! (pure functions of rank, size and root, tested without sockets), and
//! the worker code that runs them over the connections.
//!
//! * `choose`: which algorithm an op runs, by its size and the group's.
//! * Schedules: `doubling` (the recursive-doubling all_reduce), `tree`
//!   (the binomial tree of broadcast and reduce), `dissemination` (the
//!   barrier).
//! * Running them: `run_direct` (the direct small algorithms of small
//!   groups), `run_logarithmic` (the schedules above over the worker's
//!   connections), `run_board` (the small ops of a group whose ranks
//!   share one host, on its shared-memory board), `exec` (the pipelined ring and what every algorithm
//!   shares: chunks, byte ranges, reductions).

mod choose;
mod dissemination;
mod doubling;
mod exec;
mod run_board;
mod run_direct;
mod run_logarithmic;
mod tree;
