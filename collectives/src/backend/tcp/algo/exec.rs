//! Running an op: `Worker::execute` takes the algorithm `choose` gives
//! (the direct and logarithmic ones live beside this file), and this file
//! holds the pipelined ring and what every algorithm shares (blocks,
//! chunks, byte ranges, reductions of raw bytes).

use std::ops::Range;

use chorus_core::{OpContext, WorkError};

use super::super::conn::Frame;
use super::super::shm::Reserved;
use super::super::wire::{
    op_code, wire_seq, Sig, ALGO_BOARD, ALGO_CHAIN, ALGO_CHECK, ALGO_DIRECT, ALGO_DISSEMINATION,
    ALGO_DOUBLING, ALGO_RING, ALGO_RS_BCAST, ALGO_TREE, CLASS_COLL, CLASS_P2P, NONE32, NONE8,
};
use super::super::worker::{Active, Worker};
use super::choose::{self, AllReduce};
use crate::reduce::{self, finish_avg, Reducible};
use chorus_core::{DType, HostBuffer, Op, ReduceOp};

/// Elements `i` of `0..count` split into `n` blocks as evenly as possible
/// (the first `count % n` blocks get one more).
fn block(count: usize, n: usize, i: usize) -> Range<usize> {
    let base = count / n;
    let rem = count % n;
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

/// Number of chunks of `len` elements, at least one (an empty op still
/// exchanges one empty frame, so every op is checked on the wire).
pub(super) fn nchunks(len: usize, ce: usize) -> usize {
    len.div_ceil(ce).max(1)
}

/// Chunk `k` of `r`.
pub(super) fn chunk(r: &Range<usize>, ce: usize, k: usize) -> Range<usize> {
    let s = (r.start + k * ce).min(r.end);
    s..(s + ce).min(r.end)
}

/// Byte range of an element range.
pub(super) fn bytes(r: &Range<usize>, es: usize) -> Range<usize> {
    r.start * es..r.end * es
}

/// The chunks of `all`, `ce` elements each (at least one, see
/// [`nchunks`]): each chunk's element range and its byte range for
/// elements of `es` bytes.
pub(super) fn chunks(
    all: &Range<usize>,
    ce: usize,
    es: usize,
) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    let all = all.clone();
    (0..nchunks(all.len(), ce)).map(move |k| {
        let c = chunk(&all, ce, k);
        let b = bytes(&c, es);
        (c, b)
    })
}

/// `dst[r] = op(dst[r], src)` (`src`: raw bytes of `dst`'s dtype).
fn combine_into(op: ReduceOp, dst: &mut HostBuffer, r: Range<usize>, src: &[u8]) {
    let dtype = dst.dtype();
    let es = dtype.size();
    combine_bytes(op, dtype, &mut dst.as_bytes_mut()[bytes(&r, es)], src);
}

fn copy_in(dst: &mut HostBuffer, r: &Range<usize>, src: &[u8]) {
    let es = dst.dtype().size();
    dst.as_bytes_mut()[bytes(r, es)].copy_from_slice(src);
}

/// `d[i] = f(d[i], s[i])`; with `f` known at compile time the loop is
/// vectorised.
#[inline(always)]
fn zip_with<T: Copy>(d: &mut [T], s: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in d.iter_mut().zip(s) {
        *d = f(*d, *s);
    }
}

fn combine_raw<T: Reducible>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        // One loop per op (the op is not re-tested per element), the same
        // arithmetic as `T::combine`, so results are bit-identical to the
        // serial reference.
        match op {
            ReduceOp::Sum | ReduceOp::Avg => zip_with(d, s, |a, b| T::combine(ReduceOp::Sum, a, b)),
            ReduceOp::Prod => zip_with(d, s, |a, b| T::combine(ReduceOp::Prod, a, b)),
            ReduceOp::Min => zip_with(d, s, |a, b| T::combine(ReduceOp::Min, a, b)),
            ReduceOp::Max => zip_with(d, s, |a, b| T::combine(ReduceOp::Max, a, b)),
        }
        return;
    }
    let size = std::mem::size_of::<T>();
    for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
        let a: T = bytemuck::pod_read_unaligned(d);
        let b: T = bytemuck::pod_read_unaligned(s);
        d.copy_from_slice(bytemuck::bytes_of(&T::combine(op, a, b)));
    }
}

/// `out[i] = f(a[i], b[i])`, vectorised like [`zip_with`].
#[inline(always)]
fn zip3_with<T: Copy>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
        *o = f(*a, *b);
    }
}

fn combine3_raw<T: Reducible>(op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    if let (Ok(o), Ok(x), Ok(y)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(out),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                zip3_with(o, x, y, |a, b| T::combine(ReduceOp::Sum, a, b))
            }
            ReduceOp::Prod => zip3_with(o, x, y, |a, b| T::combine(ReduceOp::Prod, a, b)),
            ReduceOp::Min => zip3_with(o, x, y, |a, b| T::combine(ReduceOp::Min, a, b)),
            ReduceOp::Max => zip3_with(o, x, y, |a, b| T::combine(ReduceOp::Max, a, b)),
        }
        return;
    }
    out.copy_from_slice(a);
    combine_raw::<T>(op, out, b);
}

/// `out[i] = op(a[i], b[i])` on raw bytes of `dtype`: the same bits as
/// copying `a` to `out` and then [`combine_bytes`]`(op, dtype, out, b)`.
fn combine_to(op: ReduceOp, dtype: DType, out: &mut [u8], a: &[u8], b: &[u8]) {
    use half::{bf16, f16};
    match dtype {
        DType::F32 => combine3_raw::<f32>(op, out, a, b),
        DType::F64 => combine3_raw::<f64>(op, out, a, b),
        DType::F16 => combine3_raw::<f16>(op, out, a, b),
        DType::BF16 => combine3_raw::<bf16>(op, out, a, b),
        DType::I8 => combine3_raw::<i8>(op, out, a, b),
        DType::U8 => combine3_raw::<u8>(op, out, a, b),
        DType::I32 => combine3_raw::<i32>(op, out, a, b),
        DType::I64 => combine3_raw::<i64>(op, out, a, b),
        DType::U32 => combine3_raw::<u32>(op, out, a, b),
        DType::U64 => combine3_raw::<u64>(op, out, a, b),
    }
}

/// A partial reduction of the ring's reduce-scatter, waiting to be sent on:
/// in the received frame (reduced in place), or already in a shared-memory
/// slot reserved for the next rank (reduced straight into it, which saves
/// copying it there).
enum Partial {
    Frame(Frame),
    Out(Reserved),
}

/// `dst[i] = op(dst[i], src[i])` on raw bytes of `dtype`.
pub(super) fn combine_bytes(op: ReduceOp, dtype: DType, dst: &mut [u8], src: &[u8]) {
    use half::{bf16, f16};
    match dtype {
        DType::F32 => combine_raw::<f32>(op, dst, src),
        DType::F64 => combine_raw::<f64>(op, dst, src),
        DType::F16 => combine_raw::<f16>(op, dst, src),
        DType::BF16 => combine_raw::<bf16>(op, dst, src),
        DType::I8 => combine_raw::<i8>(op, dst, src),
        DType::U8 => combine_raw::<u8>(op, dst, src),
        DType::I32 => combine_raw::<i32>(op, dst, src),
        DType::I64 => combine_raw::<i64>(op, dst, src),
        DType::U32 => combine_raw::<u32>(op, dst, src),
        DType::U64 => combine_raw::<u64>(op, dst, src),
    }
}

impl Worker {
    pub(super) fn ce(&self, dtype: DType) -> usize {
        (self.inner.opts.chunk_bytes / dtype.size()).max(1)
    }

    fn large(&self, bytes: usize) -> bool {
        bytes >= self.inner.opts.crossover_bytes
    }

    /// The other ranks, starting after this one (spreads the load).
    pub(crate) fn others(&self) -> impl Iterator<Item = usize> {
        let (n, me) = (self.n(), self.me());
        (1..n).map(move |s| (me + s) % n)
    }

    pub(super) fn op<'a>(ctx: &'a OpContext, sig: Sig) -> Active<'a> {
        Active {
            ctx,
            sig,
            class: CLASS_COLL,
        }
    }

    pub(super) fn sig(
        ctx: &OpContext,
        dtype: Option<DType>,
        redop: Option<ReduceOp>,
        root: Option<usize>,
        count: usize,
        algo: u8,
    ) -> Sig {
        Sig {
            seq: wire_seq(ctx),
            op: op_code(ctx.op),
            dtype: dtype.map_or(NONE8, |d| d as u8),
            redop: redop.map_or(NONE8, |r| r as u8),
            root: root.map_or(NONE32, |r| r as u32),
            count: count as u64,
            algo,
        }
    }

    /// The checked mode's signature round for `o`, whose own frames do not
    /// reach every rank: an empty frame with `o`'s signature to and from
    /// every other rank, each checked, before any of the op's frames. A
    /// rank that called something else at this seq is then seen by every
    /// rank, whatever the op would have exchanged. A no-op outside the
    /// checked mode.
    pub(super) async fn check_round(&mut self, o: &Active<'_>) -> Result<(), WorkError> {
        if !self.inner.checked {
            return Ok(());
        }
        let round = Active {
            ctx: o.ctx,
            sig: Sig {
                algo: ALGO_CHECK,
                ..o.sig
            },
            class: o.class,
        };
        for p in self.others() {
            self.send(&round, p, &[]).await?;
        }
        let (n, me) = (self.n(), self.me());
        for p in (0..n).filter(|&p| p != me) {
            self.recv(&round, p, 0).await?;
        }
        Ok(())
    }

    /// Runs one op on this rank.
    pub(crate) async fn execute(
        &mut self,
        ctx: &OpContext,
        op: Op,
        bufs: &mut [HostBuffer],
    ) -> Result<(), WorkError> {
        self.begin();
        if op.is_collective() {
            self.ensure_board(ctx).await?;
        }
        self.validate(ctx, op, bufs)?;
        match (op, bufs) {
            (Op::AllReduce(r), [buf]) => self.all_reduce(ctx, buf, r).await,
            (Op::Broadcast { root }, [buf]) => self.broadcast(ctx, buf, root).await,
            (Op::Reduce { root, op }, [buf]) => self.reduce(ctx, buf, root, op).await,
            (Op::AllGather, [input, output]) => self.all_gather(ctx, input, output).await,
            (Op::ReduceScatter(r), [input, output]) => {
                self.reduce_scatter(ctx, input, output, r).await
            }
            (Op::AllToAll, [input, output]) => self.all_to_all(ctx, input, output).await,
            (Op::Send { peer }, [buf]) => self.send_op(ctx, buf, peer).await,
            (Op::Recv { peer }, [buf]) => self.recv_op(ctx, buf, peer).await,
            (Op::Barrier, []) => self.barrier(ctx).await,
            (op, bufs) => Err(WorkError::InvalidArgument {
                ctx: ctx.clone(),
                msg: format!(
                    "{op} with {} buffer(s) does not run on the TCP backend",
                    bufs.len()
                ),
            }),
        }
    }

    /// Checks what the process group already checked ([`Op::check`], one
    /// dtype, no send to this rank), so that a bad request is an error
    /// rather than a panic.
    fn validate(&self, ctx: &OpContext, op: Op, bufs: &[HostBuffer]) -> Result<(), WorkError> {
        let bad = |msg: String| {
            Err(WorkError::InvalidArgument {
                ctx: ctx.clone(),
                msg,
            })
        };
        if let [a, b] = bufs {
            if a.dtype() != b.dtype() {
                return bad(format!(
                    "input is {} but output is {}",
                    a.dtype(),
                    b.dtype()
                ));
            }
        }
        let counts: Vec<usize> = bufs.iter().map(HostBuffer::len).collect();
        if let Err(msg) = op.check(self.n(), &counts) {
            return bad(msg);
        }
        match op {
            Op::Send { peer } | Op::Recv { peer } => self.check_peer(ctx, peer),
            _ => Ok(()),
        }
    }

    /// Reduces chunk `r` in rank order into `dst`: `x0 op x1 op ... op
    /// x(n-1)`, where `x(me)` is `own` and the others are `frames` (rank
    /// order, without this rank). Every rank that runs this gets the same
    /// bits, equal to `reference_reduce`.
    pub(super) fn reduce_rank_order(
        &self,
        op: ReduceOp,
        dst: &mut HostBuffer,
        r: &Range<usize>,
        own: Option<&[u8]>,
        frames: &[Frame],
    ) {
        let me = self.me();
        let es = dst.dtype().size();
        let b = bytes(r, es);
        // `own` is None when this rank's data already sits in `dst[r]`.
        let saved;
        let own: &[u8] = match own {
            Some(o) => o,
            None if me == 0 => {
                for f in frames {
                    reduce::combine_into(op, dst, r.clone(), f.payload.bytes());
                }
                return;
            }
            None => {
                let mut tmp = self.inner.pool.get(b.len());
                tmp.bytes_mut().copy_from_slice(&dst.as_bytes()[b.clone()]);
                saved = tmp;
                saved.bytes()
            }
        };
        let mut srcs = (0..self.n()).map(|p| match p.cmp(&me) {
            std::cmp::Ordering::Less => frames[p].payload.bytes(),
            std::cmp::Ordering::Equal => own,
            std::cmp::Ordering::Greater => frames[p - 1].payload.bytes(),
        });
        if let Some(first) = srcs.next() {
            dst.as_bytes_mut()[b].copy_from_slice(first);
        }
        for s in srcs {
            reduce::combine_into(op, dst, r.clone(), s);
        }
    }

    /// Reduces a received partial sum `f` with this rank's `own` chunk:
    /// straight into a slot reserved for `right` (the next hop) when one is
    /// free, else in place in the frame.
    fn reduce_partial(
        &mut self,
        right: usize,
        op: ReduceOp,
        dtype: DType,
        mut f: Frame,
        own: &[u8],
    ) -> Partial {
        match self.reserve(right, own.len()) {
            Some(r) => {
                let out = self.slot_mut(right, &r);
                combine_to(op, dtype, out, f.payload.bytes(), own);
                Partial::Out(r)
            }
            None => {
                combine_bytes(op, dtype, f.payload.bytes_mut(), own);
                Partial::Frame(f)
            }
        }
    }

    async fn all_reduce(
        &mut self,
        ctx: &OpContext,
        buf: &mut HostBuffer,
        op: ReduceOp,
    ) -> Result<(), WorkError> {
        let n = self.n();
        let count = buf.len();
        let dtype = buf.dtype();
        if n == 1 {
            finish_avg(op, buf, 0..count, 1);
            return Ok(());
        }
        let es = dtype.size();
        if self.on_board(count * es) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), None, count, ALGO_BOARD),
            );
            return self.all_reduce_board(&o, buf, op).await;
        }
        let ce = self.ce(dtype);
        let large = choose::large(count * es, self.inner.opts.crossover_bytes);
        let all_local = large && n > 2 && self.all_local(ctx).await?;
        let algo = choose::all_reduce(n, count * es, self.inner.opts.crossover_bytes, all_local);
        if algo == AllReduce::Direct {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), None, count, ALGO_DIRECT),
            );
            return self.all_reduce_direct(&o, buf, op, ce).await;
        }
        if algo == AllReduce::Doubling {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), None, count, ALGO_DOUBLING),
            );
            return self.all_reduce_doubling(&o, buf, op, ce).await;
        }
        if algo == AllReduce::RingThenBroadcastSegments {
            // Every rank on this host with shared memory: the ring's
            // reduce-scatter, then every rank writes its reduced block once
            // into its broadcast segment and every other rank copies it
            // from there (the ring's all-gather copies each block into a
            // slot at every hop).
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), None, count, ALGO_RS_BCAST),
            );
            self.check_round(&o).await?;
            let blk = |i| block(count, n, i);
            self.ring_in_place(&o, buf, Some(op), blk, ce, false)
                .await?;
            return self.gather_from_owners(&o, buf, blk, ce).await;
        }
        // Ring: reduce-scatter (rank r ends with block r reduced), then
        // all-gather.
        let o = Self::op(
            ctx,
            Self::sig(ctx, Some(dtype), Some(op), None, count, ALGO_RING),
        );
        self.check_round(&o).await?;
        self.ring_in_place(&o, buf, Some(op), |i| block(count, n, i), ce, true)
            .await
    }

    /// All-gather by owners: this rank sends each chunk of its block `blk(me)`
    /// of `buf` to every other rank at once ([`Worker::send_to_all`]), then
    /// receives every other rank's block from its owner.
    async fn gather_from_owners(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        blk: impl Fn(usize) -> Range<usize>,
        ce: usize,
    ) -> Result<(), WorkError> {
        let es = buf.dtype().size();
        let mine = blk(self.me());
        for k in 0..nchunks(mine.len(), ce) {
            let c = chunk(&mine, ce, k);
            self.send_to_all(o, &buf.as_bytes()[bytes(&c, es)]).await?;
        }
        let others: Vec<usize> = self.others().collect();
        for p in others {
            let b = blk(p);
            for k in 0..nchunks(b.len(), ce) {
                let c = chunk(&b, ce, k);
                let total = buf.as_bytes().len();
                self.recv_final(o, p, &mut buf.as_bytes_mut()[bytes(&c, es)], total)
                    .await?;
            }
        }
        Ok(())
    }

    /// Pipelined ring on `buf`, whose block `i` is `blk(i)`. With `op`, a
    /// reduce-scatter (`n - 1` steps, after which this rank's block is
    /// reduced and, for `Avg`, divided) comes first; then, with `gather`, an
    /// all-gather (`n - 1` steps) spreads every rank's block.
    ///
    /// At step `s` this rank sends one block to the right and receives one
    /// from the left; the block received at step `s` is the one sent at step
    /// `s + 1`. Chunks are scheduled as a wavefront: at time `t` the rank
    /// handles chunk `t - s` of every step `s`, so chunk `k` of step `s + 1`
    /// goes out right after chunk `k` of step `s` came in (still in cache),
    /// and all steps stream at once.
    async fn ring_in_place(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        op: Option<ReduceOp>,
        blk: impl Fn(usize) -> Range<usize>,
        ce: usize,
        gather: bool,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let es = buf.dtype().size();
        let (left, right) = ((me + n - 1) % n, (me + 1) % n);
        let rs = if op.is_some() { n - 1 } else { 0 };
        let steps = rs + if gather { n - 1 } else { 0 };
        if steps == 0 {
            return Ok(());
        }
        // Block sent / received at step s.
        let sid = |s: usize| {
            if s < rs {
                (me + 2 * n - s - 1) % n
            } else {
                (me + 2 * n - (s - rs)) % n
            }
        };
        let rid = |s: usize| {
            if s < rs {
                (me + 2 * n - s - 2) % n
            } else {
                (me + 2 * n - (s - rs) - 1) % n
            }
        };
        let kmax = (0..n).map(|i| nchunks(blk(i).len(), ce)).max().unwrap_or(1);
        let dtype = buf.dtype();
        // Partial reductions of the reduce-scatter, by chunk: received at
        // step s, combined with this rank's data and sent on at step s + 1
        // from the receive buffer (still in cache). Only each rank's own
        // block is written to `buf`; the others are overwritten by the
        // all-gather anyway.
        let mut partial: Vec<Option<Partial>> = (0..kmax).map(|_| None).collect();
        for t in 0..kmax + steps - 1 {
            let lo = t.saturating_sub(kmax - 1);
            let hi = t.min(steps - 1);
            for s in lo..=hi {
                let (b, k) = (blk(sid(s)), t - s);
                if k < nchunks(b.len(), ce) {
                    match partial[k].take() {
                        Some(Partial::Frame(p)) => self.send(o, right, p.payload.bytes()).await?,
                        Some(Partial::Out(r)) => self.send_reserved(o, right, r).await?,
                        None => {
                            let c = chunk(&b, ce, k);
                            self.send(o, right, &buf.as_bytes()[bytes(&c, es)]).await?
                        }
                    }
                }
            }
            for s in lo..=hi {
                let (b, k) = (blk(rid(s)), t - s);
                if k < nchunks(b.len(), ce) {
                    let c = chunk(&b, ce, k);
                    match op {
                        Some(op) if s + 1 < rs => {
                            let f = self.recv(o, left, c.len() * es).await?;
                            let own = &buf.as_bytes()[bytes(&c, es)];
                            partial[k] = Some(self.reduce_partial(right, op, dtype, f, own));
                        }
                        Some(op) if s < rs => {
                            let f = self.recv(o, left, c.len() * es).await?;
                            combine_into(op, buf, c.clone(), f.payload.bytes());
                            finish_avg(op, buf, c, n);
                        }
                        // The last step's blocks are not sent on.
                        _ if s + 1 == steps => {
                            let total = buf.as_bytes().len();
                            let dst = &mut buf.as_bytes_mut()[bytes(&c, es)];
                            self.recv_final(o, left, dst, total).await?
                        }
                        _ => {
                            self.recv_into(o, left, &mut buf.as_bytes_mut()[bytes(&c, es)])
                                .await?
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn broadcast(
        &mut self,
        ctx: &OpContext,
        buf: &mut HostBuffer,
        root: usize,
    ) -> Result<(), WorkError> {
        let n = self.n();
        if n == 1 {
            return Ok(());
        }
        let (me, count, dtype) = (self.me(), buf.len(), buf.dtype());
        let es = dtype.size();
        let ce = self.ce(dtype);
        let all = 0..count;
        if self.on_board(count * es) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), None, Some(root), count, ALGO_BOARD),
            );
            return self.broadcast_board(&o, buf, root).await;
        }
        if !self.large(count * es) && choose::direct(n) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), None, Some(root), count, ALGO_DIRECT),
            );
            self.check_round(&o).await?;
            return self.broadcast_direct(&o, buf, root, ce).await;
        }
        if !self.large(count * es) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), None, Some(root), count, ALGO_TREE),
            );
            self.check_round(&o).await?;
            return self.broadcast_tree(&o, buf, root, ce).await;
        }
        // Pipelined chain root -> root+1 -> ... -> root+n-1.
        let o = Self::op(
            ctx,
            Self::sig(ctx, Some(dtype), None, Some(root), count, ALGO_CHAIN),
        );
        self.check_round(&o).await?;
        let v = (me + n - root) % n;
        let next = (v < n - 1).then_some((me + 1) % n);
        let prev = (me + n - 1) % n;
        if v != 0 {
            // An empty frame to the root first, which it reads once it has
            // sent everything: it learns that every rank is done, and ranks
            // that disagree on the root see each other's header at once
            // instead of each waiting for a chain that never starts.
            self.send(&o, root, &[]).await?;
        }
        for k in 0..nchunks(count, ce) {
            let c = chunk(&all, ce, k);
            if v == 0 {
                if let Some(nx) = next {
                    self.send(&o, nx, &buf.as_bytes()[bytes(&c, es)]).await?;
                }
            } else {
                self.recv_into(&o, prev, &mut buf.as_bytes_mut()[bytes(&c, es)])
                    .await?;
                if let Some(nx) = next {
                    self.send(&o, nx, &buf.as_bytes()[bytes(&c, es)]).await?;
                }
            }
        }
        if v == 0 {
            for p in (0..n).filter(|&p| p != me) {
                self.recv(&o, p, 0).await?;
            }
        }
        Ok(())
    }

    async fn reduce(
        &mut self,
        ctx: &OpContext,
        buf: &mut HostBuffer,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), WorkError> {
        let n = self.n();
        let (count, dtype) = (buf.len(), buf.dtype());
        if n == 1 {
            finish_avg(op, buf, 0..count, 1);
            return Ok(());
        }
        if self.on_board(count * dtype.size()) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), Some(root), count, ALGO_BOARD),
            );
            return self.reduce_board(&o, buf, root, op).await;
        }
        let ce = self.ce(dtype);
        if choose::direct(n) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), Some(root), count, ALGO_DIRECT),
            );
            self.check_round(&o).await?;
            return self.reduce_direct(&o, buf, root, op, ce).await;
        }
        let o = Self::op(
            ctx,
            Self::sig(ctx, Some(dtype), Some(op), Some(root), count, ALGO_TREE),
        );
        self.check_round(&o).await?;
        self.reduce_tree(&o, buf, root, op, ce).await
    }

    async fn all_gather(
        &mut self,
        ctx: &OpContext,
        input: &HostBuffer,
        output: &mut HostBuffer,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let k = input.len();
        let dtype = input.dtype();
        let es = dtype.size();
        let ce = self.ce(dtype);
        copy_in(output, &(me * k..(me + 1) * k), input.as_bytes());
        if n == 1 {
            return Ok(());
        }
        if self.large(n * k * es) {
            let o = Self::op(ctx, Self::sig(ctx, Some(dtype), None, None, k, ALGO_RING));
            self.check_round(&o).await?;
            return self
                .ring_in_place(&o, output, None, |i| i * k..(i + 1) * k, ce, true)
                .await;
        }
        let o = Self::op(ctx, Self::sig(ctx, Some(dtype), None, None, k, ALGO_DIRECT));
        let all = 0..k;
        for j in 0..nchunks(k, ce) {
            let c = chunk(&all, ce, j);
            self.send_to_all(&o, &input.as_bytes()[bytes(&c, es)])
                .await?;
            for p in (0..n).filter(|&p| p != me) {
                let dst = bytes(&(p * k + c.start..p * k + c.end), es);
                self.recv_into(&o, p, &mut output.as_bytes_mut()[dst])
                    .await?;
            }
        }
        Ok(())
    }

    async fn reduce_scatter(
        &mut self,
        ctx: &OpContext,
        input: &HostBuffer,
        output: &mut HostBuffer,
        op: ReduceOp,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let k = output.len();
        let dtype = input.dtype();
        let es = dtype.size();
        let ce = self.ce(dtype);
        let all = 0..k;
        let inb = |p: usize, c: &Range<usize>| {
            &input.as_bytes()[(p * k + c.start) * es..(p * k + c.end) * es]
        };
        if n == 1 {
            copy_in(output, &all, inb(0, &all));
            finish_avg(op, output, all, 1);
            return Ok(());
        }
        if !self.large(n * k * es) {
            let o = Self::op(
                ctx,
                Self::sig(ctx, Some(dtype), Some(op), None, k, ALGO_DIRECT),
            );
            let mut frames = Vec::with_capacity(n - 1);
            for j in 0..nchunks(k, ce) {
                let c = chunk(&all, ce, j);
                for p in self.others() {
                    self.send(&o, p, inb(p, &c)).await?;
                }
                frames.clear();
                for p in (0..n).filter(|&p| p != me) {
                    frames.push(self.recv(&o, p, c.len() * es).await?);
                }
                self.reduce_rank_order(op, output, &c, Some(inb(me, &c)), &frames);
            }
            finish_avg(op, output, all, n);
            return Ok(());
        }
        // Ring: the partial sum of a block travels n-1 hops and ends at its
        // owner; partials live in received frames, the input is not touched.
        let o = Self::op(
            ctx,
            Self::sig(ctx, Some(dtype), Some(op), None, k, ALGO_RING),
        );
        self.check_round(&o).await?;
        // Wavefront schedule as in `ring_in_place`: chunk j of step s at
        // time j + s; the partial received for chunk j at step s goes out at
        // step s + 1.
        let (left, right) = ((me + n - 1) % n, (me + 1) % n);
        let nck = nchunks(k, ce);
        let steps = n - 1;
        let mut partial: Vec<Option<Partial>> = (0..nck).map(|_| None).collect();
        for t in 0..nck + steps - 1 {
            let lo = t.saturating_sub(nck - 1);
            let hi = t.min(steps - 1);
            for s in lo..=hi {
                let j = t - s;
                let c = chunk(&all, ce, j);
                match partial[j].take() {
                    Some(Partial::Frame(p)) => self.send(&o, right, p.payload.bytes()).await?,
                    Some(Partial::Out(r)) => self.send_reserved(&o, right, r).await?,
                    None => {
                        let sbi = (me + 2 * n - s - 1) % n;
                        self.send(&o, right, inb(sbi, &c)).await?;
                    }
                }
            }
            for s in lo..=hi {
                let j = t - s;
                let c = chunk(&all, ce, j);
                let f = self.recv(&o, left, c.len() * es).await?;
                if s + 1 < steps {
                    let rbi = (me + 2 * n - s - 2) % n;
                    let own = inb(rbi, &c);
                    partial[j] = Some(self.reduce_partial(right, op, dtype, f, own));
                } else {
                    copy_in(output, &c, inb(me, &c));
                    combine_into(op, output, c.clone(), f.payload.bytes());
                    finish_avg(op, output, c, n);
                }
            }
        }
        Ok(())
    }

    async fn all_to_all(
        &mut self,
        ctx: &OpContext,
        input: &HostBuffer,
        output: &mut HostBuffer,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let total = input.len();
        let k = total / n;
        let dtype = input.dtype();
        let es = dtype.size();
        let ce = self.ce(dtype);
        let blk = |p: usize| p * k..(p + 1) * k;
        copy_in(output, &blk(me), &input.as_bytes()[bytes(&blk(me), es)]);
        if n == 1 {
            return Ok(());
        }
        let o = Self::op(
            ctx,
            Self::sig(ctx, Some(dtype), None, None, total, ALGO_DIRECT),
        );
        let all = 0..k;
        for s in 1..n {
            let to = (me + s) % n;
            let from = (me + n - s) % n;
            for j in 0..nchunks(k, ce) {
                let c = chunk(&all, ce, j);
                let sc = to * k + c.start..to * k + c.end;
                self.send(&o, to, &input.as_bytes()[bytes(&sc, es)]).await?;
                let dst = bytes(&(from * k + c.start..from * k + c.end), es);
                self.recv_into(&o, from, &mut output.as_bytes_mut()[dst])
                    .await?;
            }
        }
        Ok(())
    }

    fn p2p_op<'a>(ctx: &'a OpContext, buf: &HostBuffer) -> Active<'a> {
        // Both sides describe the message as the sender's op.
        let mut sig = Self::sig(ctx, Some(buf.dtype()), None, None, buf.len(), ALGO_DIRECT);
        sig.op = op_code("send");
        Active {
            ctx,
            sig,
            class: CLASS_P2P,
        }
    }

    fn check_peer(&self, ctx: &OpContext, peer: usize) -> Result<(), WorkError> {
        if peer >= self.n() || peer == self.me() {
            return Err(WorkError::InvalidArgument {
                ctx: ctx.clone(),
                msg: format!(
                    "peer {peer} is not another rank of this group of {}",
                    self.n()
                ),
            });
        }
        Ok(())
    }

    async fn send_op(
        &mut self,
        ctx: &OpContext,
        buf: &HostBuffer,
        peer: usize,
    ) -> Result<(), WorkError> {
        let o = Self::p2p_op(ctx, buf);
        let es = buf.dtype().size();
        let ce = self.ce(buf.dtype());
        let all = 0..buf.len();
        for (_, b) in chunks(&all, ce, es) {
            self.send(&o, peer, &buf.as_bytes()[b]).await?;
        }
        Ok(())
    }

    async fn recv_op(
        &mut self,
        ctx: &OpContext,
        buf: &mut HostBuffer,
        peer: usize,
    ) -> Result<(), WorkError> {
        let o = Self::p2p_op(ctx, buf);
        let es = buf.dtype().size();
        let ce = self.ce(buf.dtype());
        let all = 0..buf.len();
        for (c, b) in chunks(&all, ce, es) {
            let f = self.recv(&o, peer, b.len()).await?;
            copy_in(buf, &c, f.payload.bytes());
        }
        Ok(())
    }

    async fn barrier(&mut self, ctx: &OpContext) -> Result<(), WorkError> {
        if self.n() == 1 {
            return Ok(());
        }
        if self.on_board(0) {
            let o = Self::op(ctx, Self::sig(ctx, None, None, None, 0, ALGO_BOARD));
            return self.barrier_board(&o).await;
        }
        if choose::direct(self.n()) {
            let o = Self::op(ctx, Self::sig(ctx, None, None, None, 0, ALGO_DIRECT));
            return self.barrier_direct(&o).await;
        }
        let o = Self::op(ctx, Self::sig(ctx, None, None, None, 0, ALGO_DISSEMINATION));
        self.barrier_dissemination(&o).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_everything() {
        for count in 0..40 {
            for n in 1..7 {
                let mut next = 0;
                for i in 0..n {
                    let b = block(count, n, i);
                    assert_eq!(b.start, next);
                    assert!(b.len() == count / n || b.len() == count / n + 1);
                    next = b.end;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn chunks_cover_everything() {
        for len in 0..50 {
            for ce in 1..9 {
                let r = 3..3 + len;
                let mut next = r.start;
                for k in 0..nchunks(len, ce) {
                    let c = chunk(&r, ce, k);
                    assert_eq!(c.start, next);
                    assert!(c.len() <= ce);
                    next = c.end;
                }
                assert_eq!(next, r.end);
            }
        }
    }

    #[test]
    fn combine_to_matches_copy_then_combine() {
        let a: Vec<f32> = vec![1.5, -2.0, 3.25, 7.0];
        let b: Vec<f32> = vec![0.5, 4.0, -1.0, -7.5];
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            let mut want = bytemuck::cast_slice::<f32, u8>(&a).to_vec();
            combine_bytes(op, DType::F32, &mut want, bytemuck::cast_slice(&b));
            let mut out = vec![0u8; 16];
            combine_to(
                op,
                DType::F32,
                &mut out,
                bytemuck::cast_slice(&a),
                bytemuck::cast_slice(&b),
            );
            assert_eq!(out, want, "{op:?}");
            // Unaligned output.
            let mut u = [0u8; 17];
            combine_to(
                op,
                DType::F32,
                &mut u[1..],
                bytemuck::cast_slice(&a),
                bytemuck::cast_slice(&b),
            );
            assert_eq!(&u[1..], &want[..], "{op:?}");
        }
    }

    #[test]
    fn raw_combine_matches_typed() {
        let a: Vec<f32> = vec![1.5, -2.0, 3.25];
        let b: Vec<f32> = vec![0.5, 4.0, -1.0];
        let mut d = bytemuck::cast_slice::<f32, u8>(&a).to_vec();
        combine_bytes(ReduceOp::Sum, DType::F32, &mut d, bytemuck::cast_slice(&b));
        let got: Vec<f32> = d
            .chunks_exact(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(got, vec![2.0, 2.0, 2.25]);
        // Unaligned destination.
        let mut u = [0u8; 1 + 12];
        u[1..].copy_from_slice(bytemuck::cast_slice(&a));
        combine_bytes(
            ReduceOp::Max,
            DType::F32,
            &mut u[1..],
            bytemuck::cast_slice(&b),
        );
        let got: Vec<f32> = u[1..]
            .chunks_exact(4)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        assert_eq!(got, vec![1.5, 4.0, 3.25]);
    }
}
