//! Batches on the TCP backend.
//!
//! * The batch's sends go first: a send never waits for its receiver (the
//!   peer's reader task drains the socket), so a recv staged before the
//!   matching send on every rank (a ring) cannot deadlock, as it cannot
//!   inside an NCCL group. The ops of a batch have no order among
//!   themselves, and per-peer message order is kept.
//! * A run of all_reduces with the same dtype and reduction travels as one
//!   all_reduce of their concatenation (one message exchange instead of one
//!   per op, as Gloo's coalesced all_reduce does); every other op runs as it
//!   is, in order.

use chorus_core::{Completer, Failed, HostBuffer, Op, OpContext, OpFuture, Registry, WorkError};

use super::request::OpRequest;

/// One all_reduce folded into a fused one: where its result goes.
struct Member {
    ctx: OpContext,
    buf: HostBuffer,
    completer: Completer<Vec<HostBuffer>>,
}

/// The requests to queue for a batch: runs of two or more all_reduces with
/// equal dtype and reduction replaced by one fused request each. Falls back
/// to the requests as they are when chorus's runtime is unavailable.
pub(super) fn fuse(reqs: Vec<OpRequest>) -> Vec<OpRequest> {
    let handle = chorus_store::rt::handle().ok();
    let (sends, rest): (Vec<_>, Vec<_>) = reqs
        .into_iter()
        .partition(|r| matches!(r.op, Op::Send { .. }));
    let mut out = sends;
    let mut run: Vec<OpRequest> = Vec::new();
    for r in rest {
        let joins = match (run.first(), r.op) {
            (Some(first), Op::AllReduce(ob)) => {
                first.op == Op::AllReduce(ob) && dtype_of(first) == dtype_of(&r)
            }
            (None, Op::AllReduce(_)) => true,
            _ => false,
        };
        if !joins {
            flush(&mut run, &mut out, handle.as_ref());
        }
        if matches!(r.op, Op::AllReduce(_)) {
            run.push(r);
        } else {
            out.push(r);
        }
    }
    flush(&mut run, &mut out, handle.as_ref());
    out
}

fn flush(
    run: &mut Vec<OpRequest>,
    out: &mut Vec<OpRequest>,
    handle: Option<&tokio::runtime::Handle>,
) {
    let Some(handle) = handle.filter(|_| run.len() >= 2) else {
        out.append(run);
        return;
    };
    let reqs = std::mem::take(run);
    let Some(first) = reqs.first() else {
        return;
    };
    let (dtype, op) = match (first.op, dtype_of(first)) {
        (Op::AllReduce(_), Some(dtype)) => (dtype, first.op),
        _ => return out.extend(reqs),
    };
    let ctx = first.ctx.clone();
    let timeout = reqs
        .iter()
        .map(|r| r.timeout)
        .max()
        .unwrap_or(first.timeout);
    let total: usize = reqs.iter().map(op_len).sum();
    let mut fused = HostBuffer::zeros(dtype, total);
    let mut members = Vec::with_capacity(reqs.len());
    let mut at = 0;
    for r in reqs {
        let OpRequest {
            ctx,
            bufs,
            completer,
            ..
        } = r;
        let Ok([buf]) = <[HostBuffer; 1]>::try_from(bufs) else {
            continue;
        };
        let bytes = buf.as_bytes();
        fused.as_bytes_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
        members.push(Member {
            ctx,
            buf,
            completer,
        });
    }
    // The fused op's own work lives in a registry of its own: the members'
    // works stay in the group's registry (deadlines, flight recorder) and
    // are completed from the fused result.
    let registry = std::sync::Arc::new(Registry::new());
    let (work, completer) = match OpFuture::<Vec<HostBuffer>>::new(ctx.clone(), &registry, None) {
        Ok(pair) => pair,
        Err(e) => {
            for m in members {
                m.completer.fail(e.for_op(m.ctx), vec![m.buf]);
            }
            return;
        }
    };
    for m in &members {
        m.completer.started();
    }
    handle.spawn(async move {
        let res = work.await;
        scatter(res, members);
    });
    out.push(OpRequest {
        ctx,
        op,
        bufs: vec![fused],
        timeout,
        completer,
    });
}

/// The element type of a request's first buffer.
fn dtype_of(r: &OpRequest) -> Option<chorus_core::DType> {
    r.bufs.first().map(HostBuffer::dtype)
}

/// The element count of a request's first buffer.
fn op_len(r: &OpRequest) -> usize {
    r.bufs.first().map_or(0, HostBuffer::len)
}

/// Copies each member's part of the fused result back into its own buffer
/// and completes it; a failure fails every member, each with its own
/// buffer back (contents as they were).
fn scatter(res: Result<Vec<HostBuffer>, Failed<Vec<HostBuffer>>>, members: Vec<Member>) {
    let fused = match res.map(|mut v| v.pop()) {
        Ok(Some(b)) => b,
        Ok(None) => {
            for m in members {
                let err = WorkError::Backend {
                    ctx: m.ctx.clone(),
                    msg: "a fused all_reduce returned no buffer (a chorus bug)".into(),
                };
                m.completer.fail(err, vec![m.buf]);
            }
            return;
        }
        Err(f) => {
            for m in members {
                m.completer.fail(f.error.for_op(m.ctx), vec![m.buf]);
            }
            return;
        }
    };
    let src = fused.as_bytes();
    let mut at = 0;
    for mut m in members {
        let dst = m.buf.as_bytes_mut();
        let n = dst.len();
        dst.copy_from_slice(&src[at..at + n]);
        at += n;
        m.completer.complete(Ok(vec![m.buf]));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use chorus_core::{HostBuffer, Op, OpContext, OpFuture, ReduceOp, Registry};

    use super::super::request::OpRequest;
    use super::fuse;

    fn req(
        reg: &Arc<Registry>,
        seq: u64,
        (op, buf): (Op, HostBuffer),
    ) -> (OpFuture<Vec<HostBuffer>>, OpRequest) {
        let ctx = OpContext {
            rank: 0,
            group: "g".into(),
            seq,
            op: op.name(),
            internal: None,
        };
        let (work, completer) = OpFuture::new(ctx.clone(), reg, None).expect("registry");
        let r = OpRequest {
            ctx,
            op,
            bufs: vec![buf],
            timeout: Duration::from_secs(5),
            completer,
        };
        (work, r)
    }

    fn f32s(v: &[f32]) -> HostBuffer {
        HostBuffer::F32(v.to_vec())
    }

    #[test]
    fn sends_go_first_and_runs_of_matching_all_reduces_fuse() {
        let reg = Arc::new(Registry::new());
        let ar = |v: &[f32], op| (Op::AllReduce(op), f32s(v));
        let plan = vec![
            ar(&[1.0, 2.0], ReduceOp::Sum),
            ar(&[3.0], ReduceOp::Sum),
            ar(&[4.0], ReduceOp::Max), // another reduction: a new run
            (Op::Recv { peer: 1 }, f32s(&[0.0])),
            (Op::Send { peer: 1 }, f32s(&[9.0])),
            ar(&[5.0], ReduceOp::Sum),
            // Another dtype: not fused with the f32 one before it.
            (Op::AllReduce(ReduceOp::Sum), HostBuffer::I32(vec![7])),
        ];
        let mut works = Vec::new();
        let mut reqs = Vec::new();
        for (i, k) in plan.into_iter().enumerate() {
            let (w, r) = req(&reg, i as u64 + 1, k);
            works.push(w);
            reqs.push(r);
        }
        let out = fuse(reqs);
        let shape: Vec<(&str, usize)> =
            out.iter().map(|r| (r.op.name(), r.bufs[0].len())).collect();
        assert_eq!(
            shape,
            vec![
                ("send", 1),
                ("all_reduce", 3), // the two f32 sums, fused
                ("all_reduce", 1), // max
                ("recv", 1),
                ("all_reduce", 1), // f32 sum after the recv
                ("all_reduce", 1), // i32 sum
            ]
        );
        // The fused request completes its members with their own parts.
        let mut out = out.into_iter();
        let _send = out.next();
        let fused = out.next().expect("fused request");
        assert_eq!(
            fused.ctx.seq, 1,
            "a fused op carries its first member's seq"
        );
        fused
            .completer
            .complete(Ok(vec![HostBuffer::F32(vec![10.0, 20.0, 30.0])]));
        let a = futures::executor::block_on(works.remove(0)).expect("member 1");
        let b = futures::executor::block_on(works.remove(0)).expect("member 2");
        assert_eq!(a, vec![HostBuffer::F32(vec![10.0, 20.0])]);
        assert_eq!(b, vec![HostBuffer::F32(vec![30.0])]);
    }
}
