//! chorus: async collectives for Rust.
//!
//! A [`ProcessGroup`] runs collectives (all_reduce, broadcast, reduce,
//! all_gather, reduce_scatter, all_to_all, send/recv, barrier) across the
//! ranks of a job. Each call is submitted at once, in program order, and
//! returns a work future that owns the op's buffers until the op is done and
//! then yields them back: a [`Work`] for host buffers (TCP backend), a
//! [`DeviceWork`] with explicit completion levels for device buffers (NCCL).
//!
//! This crate is all a user needs; it re-exports what it uses of the layers
//! below it (`chorus-core`, `chorus-gpu`, `chorus-store`). A map:
//!
//! * [`process_group`]: [`ProcessGroup`], its [`GroupBuilder`] and
//!   subgroups; batches of ops launched as one ([`Batch`], [`Batched`]);
//!   CUDA graph capture ([`Capture`]).
//! * [`Work`] and [`DeviceWork`]: the futures ops return.
//! * [`OpBuffer`]: the buffers an op takes, and how their type picks the
//!   backend at compile time; [`DeviceMem`], the open trait for device
//!   memory of other crates.
//! * Element types and reductions: [`DType`], [`Element`], [`ReduceOp`].
//! * [`Error`], [`Rejected`] (a refused op, with its buffers) and
//!   [`Failed`] (a failed op, with its buffers once nothing touches them);
//!   [`WorkError`], the error of an op, with its [`OpContext`].
//! * [`watchdog`]: timeouts, error policies, flight-recorder dumps, the
//!   heartbeat monitor; [`propagation`]: errors published to the peers;
//!   [`flight_recorder`]: what a dump holds; [`recovery`]: re-forming a
//!   group from the survivors of a failure ([`ProcessGroup::reform`]).
//! * [`store`] and [`rendezvous`]: the job's key-value store and how ranks
//!   meet (torchrun, SLURM, Open MPI environments, or a builder); [`rt`]:
//!   the settings of chorus's own background I/O threads; [`wait_report`]:
//!   how a rank that waits for others (rendezvous, re-forming) reports it
//!   every few seconds.
//! * [`cuda`]: devices, streams and events; [`reactor`]: the completion
//!   reactor's settings and counters.
//! * `test_util` (feature `test-util`): helpers for tests and benchmarks
//!   (a one-rank GPU group, GPU kernels, the serial reduction reference,
//!   watchdog hooks); no part of the API chorus keeps stable.
//! * `config`: the one place where this layer reads `CHORUS_*` variables
//!   (docs/CONFIG.md lists them all).
//!
//! Inside: `sequence` (a group's identity, registry and submission lock),
//! `backend` (the backend interface, and the TCP and NCCL backends),
//! `buffer` (the routing), `batched` (the work of a batched op); `reduce` (the host arithmetic);
//! `work` and `device_work` ([`Work`] and [`DeviceWork`]); [`error`] (the
//! error types); `liveness` (peer liveness through the store);
//! `nccl_library` ([`nccl_library`], [`use_nccl_library`]); `sim_rank`
//! (feature `test-util`: a rank's control plane without its data plane,
//! for simulating thousands of ranks).
#![deny(unsafe_code)]
#![warn(missing_docs)]
// A refused op gives its buffers back inside the error (`Rejected<B>`), so
// error variants are as large as the buffers' handles by design.
#![allow(clippy::result_large_err, clippy::type_complexity)]

pub(crate) mod backend;
mod batched;
mod buffer;
mod config;
mod device_work;
pub mod error;
mod liveness;
mod nccl_library;
pub mod process_group;
pub mod propagation;
pub mod recovery;
pub(crate) mod reduce;
mod sequence;
#[cfg(feature = "test-util")]
mod sim_rank;
#[cfg(feature = "test-util")]
pub mod test_util;
pub mod watchdog;
mod work;

pub use backend::nccl::{NcclInitError, NcclOptions, ReformComms};
pub use backend::tcp::TcpOptions;
pub use batched::Batched;
pub use buffer::OpBuffer;
pub use chorus_core::flight_recorder;
pub use chorus_core::{DType, Element, HostBuffer, HostBuffers, OpContext, ReduceOp};
pub use chorus_core::{Failed, WorkError, WorkStatus};
pub use chorus_gpu::cuda::{self, Device, Event, Stream, StreamPriority};
pub use chorus_gpu::nccl::{
    DeviceBuffer, DeviceBuffers, DeviceElement, DeviceMem, EndEvent, Graph, NcclCommError,
    RawDeviceBuffer, Ticket,
};
pub use chorus_gpu::placement::{OnDevice, OnHost, Placement};
pub use chorus_store::{rendezvous, wait_report};
pub use device_work::DeviceWork;
pub use error::{Error, ReformError, Rejected};
pub use nccl_library::{nccl_library, use_nccl_library};
pub use process_group::batch::Batch;
pub use process_group::capture::{Capture, CaptureBatch};
pub use process_group::{GroupBuilder, ProcessGroup, DEFAULT_REJOIN_TIMEOUT, DEFAULT_TIMEOUT};
pub use work::Work;

/// The job's key-value store: the [`Store`](store::Store) trait, the TCP
/// server and client, the prefix and in-memory stores, and the client of
/// PyTorch's TCPStore (torchrun's agent store).
pub mod store {
    pub use chorus_store::{
        ClientOptions, InMemoryStore, PrefixStore, ServerOptions, ServerStats, Store, StoreError,
        TcpStore, TcpStoreServer, TorchStore, TorchStoreOptions, DEFAULT_TIMEOUT, MAX_FRAME_LEN,
        MAX_KEYS_PER_OP, MAX_KEY_LEN, MAX_TOKEN_LEN, MAX_VALUE_LEN, TOKEN_ENV,
    };
}

/// The completion reactor (the threads that complete GPU ops and wake
/// their futures): its settings, which [`configure`](reactor::configure)
/// sets before its first use (or the `CHORUS_REACTOR_*` variables), and
/// its counters.
pub mod reactor {
    pub use chorus_gpu::reactor::{configure, stats, ReactorConfig, ReactorStats};
}

/// chorus's own background I/O threads, which run store connections and
/// the TCP backend's workers: [`configure`](rt::configure) sets how many
/// before they start (or `CHORUS_IO_THREADS`).
pub mod rt {
    pub use chorus_store::rt::configure;
}

/// Per-phase timing of the NCCL enqueue path, for benchmarks (feature
/// `profile`): switch it on, run ops, read each [`Phase`](profile::Phase)'s
/// median.
#[cfg(feature = "profile")]
pub mod profile {
    pub use chorus_core::profile::{medians, reset, set_enabled, Phase};
}

// The Rust examples of the README and of the guides in docs/ are compiled
// (and, where they can run alone, run) as doctests of this crate. The
// guides' `no_run` blocks join a job from a launcher's environment or use
// a GPU; docs/CANDLE.md's `ignore` block needs the candle adapter, a
// workspace of its own.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/ARCHITECTURE.md")]
struct ArchitectureDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/CANDLE.md")]
struct CandleDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/CONFIG.md")]
struct ConfigDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/EXAMPLES.md")]
struct ExamplesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/FAULTS.md")]
struct FaultsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/GPU.md")]
struct GpuDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/LAUNCHING.md")]
struct LaunchingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../docs/LOOM.md")]
struct LoomDoctests;
