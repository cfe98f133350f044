//! CUDA graph capture of NCCL ops.
