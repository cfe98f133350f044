//! Backends: what runs an op once its group has taken it.
//!
//! Both backends implement the one interface here. [`Backend`] is what a
//! group does with any backend (name it, launch a staged batch, close it,
//! abort it, ask it for an asynchronous error); [`Runs<S>`] runs an op
//! whose buffers come as `S` (one buffer, or an input and an output);
//! [`Coalesces<B>`] runs a one-buffer op on several buffers `B` as one op.
//!
//! | | host buffers (`Vec<T>`) | device buffers ([`DeviceMem`](chorus_gpu::nccl::DeviceMem)) |
//! |---|---|---|
//! | backend | [`tcp::TcpBackend`] | [`nccl::NcclBackend`] |
//! | work | [`Work`](crate::Work) | [`DeviceWork`](crate::DeviceWork) |
//!
//! Which one an op goes to is decided at compile time by the buffer's
//! [`Placement`](chorus_gpu::placement::Placement) (see
//! [`OpBuffer`](crate::OpBuffer)); nothing on the op path is dynamic.
//!
//! A backend receives ops in program order: it takes each op's sequence
//! number under the group's submission lock
//! ([`Sequencer::lock`](crate::sequence::Sequencer::lock)) and hands the op
//! on before it lets go, and it never blocks the caller beyond that
//! (a device op's first use of a communicator waits for its creation).
//!
//! Files: `interface` (the three traits), `tcp` and `nccl` (the backends),
//! `checked` (the checked mode of device ops, which compares the ranks'
//! launches through the TCP backend).

pub(crate) mod checked;
mod interface;
pub(crate) mod nccl;
pub(crate) mod tcp;

pub(crate) use interface::{Backend, Coalesces, Runs};
