//! Loom models of chorus-runtime live in tests/.
