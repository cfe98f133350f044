//! Running each comparison: `store` (chorus's store beside PyTorch's),
//! `tcp` (the TCP backend beside Gloo), `checked` (the checked mode's cost
//! per op), `nccl` (the NCCL backend beside PyTorch's and raw NCCL), and
//! `floor` (the machine's ping-pong floor the first two are read against).

mod checked;
mod floor;
mod nccl;
mod store;
mod tcp;

pub(crate) use checked::{bench_checked, CheckedResult};
pub(crate) use nccl::{bench_nccl, NcclResult};
pub(crate) use store::{bench_store, StoreResult};
pub(crate) use tcp::{bench_tcp, TcpRanks, SMALL_MAX};
