//! Shared helpers of the chorus examples.
