//! Running each comparison: `store` (chorus's store beside PyTorch's),
//! `tcp` (the TCP backend beside Gloo), `nccl` (the NCCL backend beside
//! PyTorch's and raw NCCL).

mod nccl;
mod store;
mod tcp;

pub(crate) use nccl::{bench_nccl, NcclResult};
pub(crate) use store::{bench_store, StoreResult};
pub(crate) use tcp::{bench_tcp, TcpRanks};
