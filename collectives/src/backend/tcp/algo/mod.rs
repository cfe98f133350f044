//! The algorithms of the TCP backend (see the table in the module docs of
//! [`tcp`](super)): schedules that say which peer gets which block when
//! (pure functions of rank, size and root, tested without sockets), and
//! the worker code that runs them over the connections.

mod choose;
mod dissemination;
mod doubling;
mod exec;
mod run_direct;
mod run_small;
mod tree;
