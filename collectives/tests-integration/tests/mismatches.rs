//! Ranks that call one collective differently — another op, dtype, count,
//! root or reduction, on one rank in every position (the first, the root,
//! the middle, the last) — on 3 and 4 ranks, small and large (ring and
//! chain) sizes, in both modes:
//!
//! * by default, every rank fails the op or, at the latest, its next op,
//!   with the mismatch as the cause (never `Ok` on both, never a lost peer
//!   or a timeout);
//! * in the checked mode (`GroupBuilder::check_ops`), every rank fails the
//!   op itself.
//!
//! Every mismatch error names both sides. A send and a recv that disagree
//! fail the recv, and the sender's next op. The ranks are tasks of this
//! process over loopback.

use std::sync::Arc;
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::{DType, ProcessGroup, ReduceOp, WorkError};
use tests_integration::testkit::build_all;

const T: Duration = Duration::from_secs(10);

/// Elements of a small op (direct algorithms) and of a large one (ring,
/// chain: 80 KB of f32, above the 64 KiB crossover).
const SMALL: usize = 6;
const LARGE: usize = 20_000;

/// The root the other ranks name.
const ROOT: usize = 1;

/// One rank's call.
#[derive(Clone, Copy, Debug)]
enum Call {
    AllReduce(usize, DType, ReduceOp),
    Broadcast(usize, DType, usize),
    Reduce(usize, DType, usize, ReduceOp),
    AllGather(usize, DType),
    ReduceScatter(usize, DType, ReduceOp),
    AllToAll(usize, DType),
    Barrier,
    Send(usize, DType, usize),
    Recv(usize, DType, usize),
    /// No op (a rank a point-to-point mismatch does not involve).
    Skip,
}

/// A buffer of `len` elements of `dtype` (f32 or f64) holding `rank`.
enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

fn buf(dtype: DType, len: usize, rank: usize) -> Buf {
    match dtype {
        DType::F64 => Buf::F64(vec![rank as f64; len]),
        _ => Buf::F32(vec![rank as f32; len]),
    }
}

/// What an op ended in: its error, or none.
type Outcome = Result<(), WorkError>;

fn outcome<B>(
    r: Result<chorus::Work<B>, chorus::Rejected<B>>,
) -> futures::future::BoxFuture<'static, Outcome>
where
    B: chorus::HostBuffers + Send + 'static,
    chorus::Work<B>: Send,
{
    match r {
        Ok(w) => Box::pin(async move { w.await.map(|_| ()).map_err(|f| f.error) }),
        Err(rej) => Box::pin(std::future::ready(Err(rej.error))),
    }
}

/// Submits `call` on `pg` (as `rank` of `n`).
fn submit(
    pg: &ProcessGroup,
    call: Call,
    rank: usize,
) -> futures::future::BoxFuture<'static, Outcome> {
    let n = pg.size();
    macro_rules! on {
        ($b:expr, $v:ident => $e:expr) => {
            match $b {
                Buf::F32($v) => $e,
                Buf::F64($v) => $e,
            }
        };
    }
    match call {
        Call::AllReduce(len, d, op) => on!(buf(d, len, rank), v => outcome(pg.all_reduce(v, op))),
        Call::Broadcast(len, d, root) => {
            on!(buf(d, len, rank), v => outcome(pg.broadcast(v, root)))
        }
        Call::Reduce(len, d, root, op) => {
            on!(buf(d, len, rank), v => outcome(pg.reduce(v, root, op)))
        }
        Call::AllGather(len, d) => match (buf(d, len, rank), buf(d, n * len, 0)) {
            (Buf::F32(i), Buf::F32(o)) => outcome(pg.all_gather(i, o)),
            (Buf::F64(i), Buf::F64(o)) => outcome(pg.all_gather(i, o)),
            _ => unreachable!("one dtype"),
        },
        Call::ReduceScatter(len, d, op) => match (buf(d, n * len, rank), buf(d, len, 0)) {
            (Buf::F32(i), Buf::F32(o)) => outcome(pg.reduce_scatter(i, o, op)),
            (Buf::F64(i), Buf::F64(o)) => outcome(pg.reduce_scatter(i, o, op)),
            _ => unreachable!("one dtype"),
        },
        Call::AllToAll(len, d) => match (buf(d, n * len, rank), buf(d, n * len, 0)) {
            (Buf::F32(i), Buf::F32(o)) => outcome(pg.all_to_all(i, o)),
            (Buf::F64(i), Buf::F64(o)) => outcome(pg.all_to_all(i, o)),
            _ => unreachable!("one dtype"),
        },
        Call::Barrier => outcome(pg.barrier()),
        Call::Send(len, d, peer) => on!(buf(d, len, rank), v => outcome(pg.send(v, peer))),
        Call::Recv(len, d, peer) => on!(buf(d, len, rank), v => outcome(pg.recv(v, peer))),
        Call::Skip => Box::pin(std::future::ready(Ok(()))),
    }
}

async fn groups(n: usize, checked: bool) -> Vec<ProcessGroup> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    build_all(n, |rank| {
        ProcessGroup::builder()
            .rank(rank)
            .world_size(n)
            .store(store.clone())
            .timeout(T)
            .peer_liveness(Duration::ZERO)
            .check_ops(checked)
    })
    .await
}

/// The mismatch behind `e`, if it is one (a later op's refusal names the
/// group's first error as its cause).
fn mismatch(e: &WorkError) -> Option<&str> {
    match e {
        WorkError::Mismatch { detail, .. } => Some(detail),
        WorkError::GroupErrored { cause, .. } => mismatch(cause),
        _ => None,
    }
}

/// Runs `calls[r]` on rank `r`, then a barrier on every rank, and checks
/// the outcome against the mode's promise.
async fn run(case: &str, calls: &[Call], checked: bool) {
    let n = calls.len();
    let gs = groups(n, checked).await;
    let tasks: Vec<_> = gs
        .iter()
        .enumerate()
        .map(|(r, g)| {
            let op = submit(g, calls[r], r);
            let next = submit(g, Call::Barrier, r);
            tokio::spawn(async move { (op.await, next.await) })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(
            tokio::time::timeout(T + Duration::from_secs(5), t)
                .await
                .unwrap_or_else(|_| panic!("{case}: a rank hung"))
                .expect("rank task"),
        );
    }
    let mut failed_at_once = 0;
    for (r, (op, next)) in outcomes.iter().enumerate() {
        let e =
            match (op, next) {
                (Err(e), _) => {
                    failed_at_once += 1;
                    e
                }
                (Ok(()), Err(e)) if !checked => e,
                (Ok(()), next) => panic!(
                "{case}: rank {r} took the result of a mismatched op ({}); its next op: {next:?}",
                if checked { "checked mode" } else { "default mode" }
            ),
            };
        let Some(detail) = mismatch(e) else {
            panic!(
                "{case}: rank {r} failed with {} instead of the mismatch: {e}",
                e.kind()
            );
        };
        assert!(
            detail.contains(" called ") && detail.contains("but rank"),
            "{case}: rank {r}'s mismatch does not name both sides: {detail}"
        );
    }
    assert!(failed_at_once > 0, "{case}: no rank failed the op itself");
}

/// The variants of one op: (name, the others' call, the odd rank's call
/// given its rank).
type Variant = (&'static str, Call, fn(usize, usize, usize) -> Call);

fn variants(len: usize) -> Vec<Variant> {
    use DType::{F32, F64};
    use ReduceOp::{Max, Sum};
    vec![
        (
            "all_reduce count",
            Call::AllReduce(len, F32, Sum),
            |len, _, _| Call::AllReduce(len + 1, F32, Sum),
        ),
        (
            "all_reduce dtype",
            Call::AllReduce(len, F32, Sum),
            |len, _, _| Call::AllReduce(len, F64, Sum),
        ),
        (
            "all_reduce op",
            Call::AllReduce(len, F32, Sum),
            |len, _, _| Call::AllReduce(len, F32, Max),
        ),
        (
            "broadcast count",
            Call::Broadcast(len, F32, ROOT),
            |len, _, _| Call::Broadcast(len + 1, F32, ROOT),
        ),
        (
            "broadcast dtype",
            Call::Broadcast(len, F32, ROOT),
            |len, _, _| Call::Broadcast(len, F64, ROOT),
        ),
        (
            "broadcast root: itself",
            Call::Broadcast(len, F32, ROOT),
            |len, n, odd| Call::Broadcast(len, F32, if odd == ROOT { (ROOT + 1) % n } else { odd }),
        ),
        (
            "broadcast root: another",
            Call::Broadcast(len, F32, ROOT),
            |len, n, odd| {
                let r = (0..n).find(|&r| r != ROOT && r != odd).unwrap_or(0);
                Call::Broadcast(len, F32, r)
            },
        ),
        (
            "reduce count",
            Call::Reduce(len, F32, ROOT, Sum),
            |len, _, _| Call::Reduce(len + 1, F32, ROOT, Sum),
        ),
        (
            "reduce dtype",
            Call::Reduce(len, F32, ROOT, Sum),
            |len, _, _| Call::Reduce(len, F64, ROOT, Sum),
        ),
        (
            "reduce op",
            Call::Reduce(len, F32, ROOT, Sum),
            |len, _, _| Call::Reduce(len, F32, ROOT, Max),
        ),
        (
            "reduce root: itself",
            Call::Reduce(len, F32, ROOT, Sum),
            |len, n, odd| {
                Call::Reduce(
                    len,
                    F32,
                    if odd == ROOT { (ROOT + 1) % n } else { odd },
                    Sum,
                )
            },
        ),
        (
            "reduce root: another",
            Call::Reduce(len, F32, ROOT, Sum),
            |len, n, odd| {
                let r = (0..n).find(|&r| r != ROOT && r != odd).unwrap_or(0);
                Call::Reduce(len, F32, r, Sum)
            },
        ),
        (
            "all_gather count",
            Call::AllGather(len, F32),
            |len, _, _| Call::AllGather(len + 1, F32),
        ),
        (
            "all_gather dtype",
            Call::AllGather(len, F32),
            |len, _, _| Call::AllGather(len, F64),
        ),
        (
            "reduce_scatter count",
            Call::ReduceScatter(len, F32, Sum),
            |len, _, _| Call::ReduceScatter(len + 1, F32, Sum),
        ),
        (
            "reduce_scatter dtype",
            Call::ReduceScatter(len, F32, Sum),
            |len, _, _| Call::ReduceScatter(len, F64, Sum),
        ),
        (
            "reduce_scatter op",
            Call::ReduceScatter(len, F32, Sum),
            |len, _, _| Call::ReduceScatter(len, F32, Max),
        ),
        ("all_to_all count", Call::AllToAll(len, F32), |len, _, _| {
            Call::AllToAll(len + 1, F32)
        }),
        ("all_to_all dtype", Call::AllToAll(len, F32), |len, _, _| {
            Call::AllToAll(len, F64)
        }),
        (
            "op: barrier for all_reduce",
            Call::AllReduce(len, F32, Sum),
            |_, _, _| Call::Barrier,
        ),
        (
            "op: all_reduce for broadcast",
            Call::Broadcast(len, F32, ROOT),
            |len, _, _| Call::AllReduce(len, F32, Sum),
        ),
    ]
}

/// Every variant whose name starts with `prefix`, on 3 and 4 ranks, with
/// the odd rank first, root, middle and last, small and large.
async fn matrix(prefix: &str, checked: bool) {
    let mut cases = 0;
    for n in [3, 4] {
        let mut positions = vec![0, ROOT, n / 2, n - 1];
        positions.dedup();
        positions.sort_unstable();
        positions.dedup();
        for len in [SMALL, LARGE] {
            for (name, others, odd_call) in variants(len) {
                if !name.starts_with(prefix) {
                    continue;
                }
                for &odd in &positions {
                    let mut calls = vec![others; n];
                    calls[odd] = odd_call(len, n, odd);
                    let case = format!(
                        "{name}, {n} ranks, rank {odd} odd, {len} elements, {}",
                        if checked { "checked" } else { "default" }
                    );
                    run(&case, &calls, checked).await;
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 0, "no variant named {prefix}");
}

macro_rules! matrix_tests {
    ($($name:ident: $prefix:literal, $checked:literal;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                matrix($prefix, $checked).await;
            }
        )*
    };
}

matrix_tests! {
    all_reduce_mismatches: "all_reduce", false;
    all_reduce_mismatches_checked: "all_reduce", true;
    broadcast_mismatches: "broadcast", false;
    broadcast_mismatches_checked: "broadcast", true;
    reduce_mismatches: "reduce ", false;
    reduce_mismatches_checked: "reduce ", true;
    all_gather_mismatches: "all_gather", false;
    all_gather_mismatches_checked: "all_gather", true;
    reduce_scatter_mismatches: "reduce_scatter", false;
    reduce_scatter_mismatches_checked: "reduce_scatter", true;
    all_to_all_mismatches: "all_to_all", false;
    all_to_all_mismatches_checked: "all_to_all", true;
    op_mismatches: "op:", false;
    op_mismatches_checked: "op:", true;
}

/// A send and its recv that disagree on count or dtype: the receiver
/// fails the recv; the sender's send finished when its bytes left, and
/// its next op fails with the receiver's mismatch, as does the next op of
/// a rank the pair does not involve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_recv_mismatches() {
    use DType::{F32, F64};
    for n in [3, 4] {
        for len in [SMALL, LARGE] {
            for (name, recv) in [
                ("count", Call::Recv(len + 1, F32, 0)),
                ("dtype", Call::Recv(len, F64, 0)),
            ] {
                let mut calls = vec![Call::Skip; n];
                calls[0] = Call::Send(len, F32, 1);
                calls[1] = recv;
                let case = format!("send/recv {name}, {n} ranks, {len} elements");
                run(&case, &calls, false).await;
            }
        }
    }
}
