//! [`OpBuffer`]: the buffers an op can take, and how their type picks the
//! backend at compile time.
//!
//! Every buffer type has a [`Placement`]: `Vec<T>` is [`OnHost`] and runs
//! on the TCP backend; every [`DeviceMem`] (chorus's [`DeviceBuffer`],
//! [`RawDeviceBuffer`], or a type of another crate) is [`OnDevice`] and runs
//! on NCCL. The placement's route (the sealed `Dispatch` trait) hands the op to its
//! backend through the one backend interface (`backend::Runs`); the op
//! methods of [`ProcessGroup`](crate::ProcessGroup) are generic over
//! `OpBuffer` and monomorphize to a direct call, with no dynamic dispatch on
//! the op path.
//!
//! [`DeviceBuffer`]: chorus_gpu::nccl::DeviceBuffer
//! [`RawDeviceBuffer`]: chorus_gpu::nccl::RawDeviceBuffer

use std::time::Duration;

use chorus_core::{Element, Op};
use chorus_gpu::nccl::DeviceMem;
use chorus_gpu::placement::{OnDevice, OnHost, Placement};

use crate::backend::{Coalesces, Runs};
use crate::batched::Batched;
use crate::device_work::DeviceWork;
use crate::error::Rejected;
use crate::process_group::batch_ops::BatchOps;
use crate::process_group::state::GroupState;
use crate::work::Work;

/// A buffer an op can take: `Vec<T>` of an [`Element`] type (host, TCP
/// backend, [`Work`]) or any [`DeviceMem`] (GPU, NCCL backend,
/// [`DeviceWork`]). Implemented for every type with a [`Placement`]; the
/// associated types name the work each kind of op returns.
pub trait OpBuffer: Placement + Sized + Send + 'static {
    /// The work of a one-buffer op (all_reduce, broadcast, reduce, send,
    /// recv); it yields the buffer back.
    type Work: Send + 'static;
    /// The work of a two-buffer op (all_gather, reduce_scatter,
    /// all_to_all); it yields `(input, output)` back.
    type PairWork: Send + 'static;
    /// The work of a coalesced op on several buffers
    /// ([`ProcessGroup::all_reduce_coalesced`](crate::ProcessGroup::all_reduce_coalesced));
    /// it yields the buffers back in order.
    type ManyWork: Send + 'static;

    #[doc(hidden)]
    fn submit1(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        b: Self,
    ) -> Result<Self::Work, Rejected<Self>>;
    #[doc(hidden)]
    fn submit2(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        i: Self,
        o: Self,
    ) -> Result<Self::PairWork, Rejected<(Self, Self)>>;
    #[doc(hidden)]
    fn submit_many(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        bufs: Vec<Self>,
    ) -> Result<Self::ManyWork, Rejected<Vec<Self>>>;
    #[doc(hidden)]
    fn stage1(
        st: &GroupState,
        batch: &mut BatchOps,
        op: Op,
        b: Self,
    ) -> Result<Batched<Self::Work>, Rejected<Self>>;
    #[doc(hidden)]
    fn stage2(
        st: &GroupState,
        batch: &mut BatchOps,
        op: Op,
        i: Self,
        o: Self,
    ) -> Result<Batched<Self::PairWork>, Rejected<(Self, Self)>>;
}

impl<B> OpBuffer for B
where
    B: Placement + Send + 'static,
    B::Place: route::Dispatch<B>,
{
    type Work = <B::Place as route::Dispatch<B>>::Work;
    type PairWork = <B::Place as route::Dispatch<B>>::PairWork;
    type ManyWork = <B::Place as route::Dispatch<B>>::ManyWork;

    fn submit1(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        b: B,
    ) -> Result<Self::Work, Rejected<B>> {
        <B::Place as route::Dispatch<B>>::submit1(st, timeout, op, b)
    }

    fn submit2(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        i: B,
        o: B,
    ) -> Result<Self::PairWork, Rejected<(B, B)>> {
        <B::Place as route::Dispatch<B>>::submit2(st, timeout, op, i, o)
    }

    fn submit_many(
        st: &GroupState,
        timeout: Duration,
        op: Op,
        bufs: Vec<B>,
    ) -> Result<Self::ManyWork, Rejected<Vec<B>>> {
        <B::Place as route::Dispatch<B>>::submit_many(st, timeout, op, bufs)
    }

    fn stage1(
        st: &GroupState,
        batch: &mut BatchOps,
        op: Op,
        b: B,
    ) -> Result<Batched<Self::Work>, Rejected<B>> {
        <B::Place as route::Dispatch<B>>::stage1(st, batch, op, b)
    }

    fn stage2(
        st: &GroupState,
        batch: &mut BatchOps,
        op: Op,
        i: B,
        o: B,
    ) -> Result<Batched<Self::PairWork>, Rejected<(B, B)>> {
        <B::Place as route::Dispatch<B>>::stage2(st, batch, op, i, o)
    }
}

/// The routes: one per placement, each to its backend.
mod route {
    use super::*;

    /// Hands the ops of buffers `B` to the backend of this placement.
    /// Sealed (the module is private); see [`OpBuffer`].
    pub trait Dispatch<B> {
        /// See [`OpBuffer::Work`].
        type Work: Send + 'static;
        /// See [`OpBuffer::PairWork`].
        type PairWork: Send + 'static;
        /// See [`OpBuffer::ManyWork`].
        type ManyWork: Send + 'static;
        /// A one-buffer op.
        fn submit1(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            b: B,
        ) -> Result<Self::Work, Rejected<B>>;
        /// A two-buffer op.
        fn submit2(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            i: B,
            o: B,
        ) -> Result<Self::PairWork, Rejected<(B, B)>>;
        /// A coalesced op.
        fn submit_many(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            bufs: Vec<B>,
        ) -> Result<Self::ManyWork, Rejected<Vec<B>>>;
        /// A one-buffer op staged in a batch.
        fn stage1(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            b: B,
        ) -> Result<Batched<Self::Work>, Rejected<B>>;
        /// A two-buffer op staged in a batch.
        fn stage2(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            i: B,
            o: B,
        ) -> Result<Batched<Self::PairWork>, Rejected<(B, B)>>;
    }

    /// Host vectors run on the TCP backend.
    impl<T: Element> Dispatch<Vec<T>> for OnHost {
        type Work = Work<Vec<T>>;
        type PairWork = Work<(Vec<T>, Vec<T>)>;
        type ManyWork = Work<Vec<Vec<T>>>;

        fn submit1(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            b: Vec<T>,
        ) -> Result<Self::Work, Rejected<Vec<T>>> {
            st.tcp.submit(&st.seq, timeout, op, b)
        }

        fn submit2(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            i: Vec<T>,
            o: Vec<T>,
        ) -> Result<Self::PairWork, Rejected<(Vec<T>, Vec<T>)>> {
            st.tcp.submit(&st.seq, timeout, op, (i, o))
        }

        fn submit_many(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            bufs: Vec<Vec<T>>,
        ) -> Result<Self::ManyWork, Rejected<Vec<Vec<T>>>> {
            st.tcp.submit_coalesced(&st.seq, timeout, op, bufs)
        }

        fn stage1(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            b: Vec<T>,
        ) -> Result<Batched<Self::Work>, Rejected<Vec<T>>> {
            match batch.host(&st.seq, op) {
                Ok(staged) => st.tcp.stage(&st.seq, staged, op, b),
                Err(e) => Err(Rejected::new(e, b)),
            }
        }

        fn stage2(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            i: Vec<T>,
            o: Vec<T>,
        ) -> Result<Batched<Self::PairWork>, Rejected<(Vec<T>, Vec<T>)>> {
            match batch.host(&st.seq, op) {
                Ok(staged) => st.tcp.stage(&st.seq, staged, op, (i, o)),
                Err(e) => Err(Rejected::new(e, (i, o))),
            }
        }
    }

    /// Device memory runs on NCCL.
    impl<B: DeviceMem> Dispatch<B> for OnDevice {
        type Work = DeviceWork<B>;
        type PairWork = DeviceWork<(B, B)>;
        type ManyWork = DeviceWork<Vec<B>>;

        fn submit1(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            b: B,
        ) -> Result<Self::Work, Rejected<B>> {
            st.nccl.submit(&st.seq, timeout, op, b)
        }

        fn submit2(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            i: B,
            o: B,
        ) -> Result<Self::PairWork, Rejected<(B, B)>> {
            st.nccl.submit(&st.seq, timeout, op, (i, o))
        }

        fn submit_many(
            st: &GroupState,
            timeout: Duration,
            op: Op,
            bufs: Vec<B>,
        ) -> Result<Self::ManyWork, Rejected<Vec<B>>> {
            st.nccl.submit_coalesced(&st.seq, timeout, op, bufs)
        }

        fn stage1(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            b: B,
        ) -> Result<Batched<Self::Work>, Rejected<B>> {
            match batch.device(&st.seq, op) {
                Ok(staged) => st.nccl.stage(&st.seq, staged, op, b),
                Err(e) => Err(Rejected::new(e, b)),
            }
        }

        fn stage2(
            st: &GroupState,
            batch: &mut BatchOps,
            op: Op,
            i: B,
            o: B,
        ) -> Result<Batched<Self::PairWork>, Rejected<(B, B)>> {
            match batch.device(&st.seq, op) {
                Ok(staged) => st.nccl.stage(&st.seq, staged, op, (i, o)),
                Err(e) => Err(Rejected::new(e, (i, o))),
            }
        }
    }
}
