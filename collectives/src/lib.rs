//! chorus (being written).
