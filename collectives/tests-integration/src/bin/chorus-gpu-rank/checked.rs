//! `checked`: the checked mode on NCCL (run with `CHORUS_CHECK_OPS=1`).
//! Device collectives the ranks call differently — a root that differs, a
//! count that differs, a group of another size — are refused on every rank
//! with `Mismatch` naming both sides before anything reaches NCCL (which
//! would hang or reduce garbage), and the group stays usable: a matching
//! all_reduce afterwards gives the serial reference.

use chorus::{ProcessGroup, ReduceOp, Stream, WorkError};
use tests_integration::testkit::{data, reference};

use super::checker::Checker;
use super::support::{down, rej, up, werr, Res};

const LEN: usize = 4099;

fn mismatch(e: &WorkError) -> Option<&str> {
    match e {
        WorkError::Mismatch { detail, .. } => Some(detail),
        _ => None,
    }
}

pub(super) async fn checked(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let mut ck = Checker::default();
    let (rank, n) = (pg.rank(), pg.size());
    if std::env::var("CHORUS_CHECK_OPS").as_deref() != Ok("1") {
        return Err("run with CHORUS_CHECK_OPS=1".into());
    }
    // Every rank names itself the root.
    let b = up(s, &data::<f32>(7_100, rank, LEN, ReduceOp::Sum))?;
    let r = pg.broadcast(b, rank);
    let detail = match &r {
        Err(rj) => mismatch(&rj.error).map(str::to_string),
        Ok(_) => None,
    };
    ck.count(
        "a broadcast whose roots differ is refused with Mismatch".into(),
        detail
            .as_deref()
            .is_some_and(|d| d.contains("root=") && d.contains("but rank")),
        format!("{:?}", r.as_ref().err().map(|e| e.error.to_string())),
    );
    drop(r);
    // The last rank reduces one element more.
    let len = if rank + 1 == n { LEN + 1 } else { LEN };
    let b = up(s, &data::<f32>(7_200, rank, len, ReduceOp::Sum))?;
    let r = pg.all_reduce(b, ReduceOp::Sum);
    let detail = match &r {
        Err(rj) => mismatch(&rj.error).map(str::to_string),
        Ok(_) => None,
    };
    ck.count(
        "an all_reduce whose counts differ is refused with Mismatch".into(),
        detail.as_deref().is_some_and(|d| d.contains("count=")),
        format!("{:?}", r.as_ref().err().map(|e| e.error.to_string())),
    );
    drop(r);
    // A group of two all_reduces on rank 0, one elsewhere.
    let mut g = pg.batch();
    let ops = if rank == 0 { 2 } else { 1 };
    let mut staged = Vec::new();
    for i in 0..ops {
        let b = up(s, &data::<f32>(7_300 + i, rank, LEN, ReduceOp::Sum))?;
        staged.push(
            g.all_reduce(b, ReduceOp::Sum)
                .map_err(rej("group all_reduce"))?,
        );
    }
    let launched = g.launch();
    ck.count(
        "a group launch of another size is refused with Mismatch".into(),
        launched
            .as_ref()
            .err()
            .and_then(mismatch)
            .is_some_and(|d| d.contains("device op(s)")),
        format!("{:?}", launched.as_ref().err().map(ToString::to_string)),
    );
    drop(staged);
    // Nothing ran: the group is usable.
    let b = up(s, &data::<f32>(7_400, rank, LEN, ReduceOp::Sum))?;
    let got = pg
        .all_reduce(b, ReduceOp::Sum)
        .map_err(rej("all_reduce after the refusals"))?
        .await
        .map_err(werr("all_reduce after the refusals"))?;
    ck.check(
        "an all_reduce after the refusals".into(),
        &down(&got)?,
        &reference::<f32>(7_400, n, LEN, ReduceOp::Sum),
    );
    Ok(ck)
}
