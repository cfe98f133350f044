//! The TCP backend (being written).
