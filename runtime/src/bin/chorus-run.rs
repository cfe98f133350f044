//! chorus-run: starts N local ranks of a program (being written).
fn main() {}
