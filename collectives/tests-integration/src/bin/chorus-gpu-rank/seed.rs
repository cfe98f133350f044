//! `seed`: communicator creations counted exactly. Three groups of the
//! same ranks (all of the world's), each running a collective and then a
//! send/recv over every pair, then both again: each group creates one
//! communicator for its collectives (split from the world's at
//! `new_group`), one per pair for its point-to-point ops (this rank takes
//! part in `size - 1` pairs), and none on the later ops; the world's count
//! does not move.

use chorus::{ProcessGroup, ReduceOp, Stream};
use tests_integration::testkit::{data, poison, reference};

use super::checker::Checker;
use super::support::{down, rej, up, werr, Res};

/// One group's round: an all_reduce, then rank `a` sends to rank `b` for
/// every ordered pair in turn (so no rank waits on a pair's creation
/// while its partner creates another).
async fn round(g: &ProcessGroup, s: &Stream, salt: u64, ck: &mut Checker) -> Res<()> {
    let (rank, n) = (g.rank(), g.size());
    let w = format!("{} all_reduce", g.name());
    let b = g
        .all_reduce(
            up(s, &data::<f32>(salt, rank, 257, ReduceOp::Sum))?,
            ReduceOp::Sum,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(
        w,
        &down(&b)?,
        &reference::<f32>(salt, n, 257, ReduceOp::Sum),
    );
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            let c = salt + 1 + (a * n + b) as u64;
            let w = format!("{} send/recv {a}->{b}", g.name());
            if rank == a {
                g.send(up(s, &data::<f32>(c, a, 31, ReduceOp::Sum))?, b)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
            } else if rank == b {
                let got = g
                    .recv(up(s, &poison::<f32>(31))?, a)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
                ck.check(w, &down(&got)?, &data::<f32>(c, a, 31, ReduceOp::Sum));
            }
        }
    }
    Ok(())
}

pub(super) async fn seed(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let mut ck = Checker::default();
    let (rank, n) = (pg.rank(), pg.size());
    let all: Vec<usize> = (0..n).collect();
    let world_before = pg.nccl_comms_created();
    let mut groups = Vec::new();
    for k in 0..3 {
        let g = pg
            .new_group(&all)
            .await
            .map_err(|e| format!("new_group {k}: {e}"))?
            .ok_or("new_group gave no group to a member")?;
        groups.push(g);
    }
    // (at creation, after the collective round, after the repeat)
    let want = [1u64, 1 + (n as u64 - 1), 1 + (n as u64 - 1)];
    for (k, g) in groups.iter().enumerate() {
        let created = g.nccl_comms_created();
        let salt = 70_000 + 1_000 * k as u64;
        round(g, s, salt, &mut ck).await?;
        let after = g.nccl_comms_created();
        round(g, s, salt + 500, &mut ck).await?;
        let again = g.nccl_comms_created();
        println!(
            "SEED rank={rank} group={} created={created} after_ops={after} after_repeat={again} expected={},{},{}",
            g.name(),
            want[0],
            want[1],
            want[2]
        );
        ck.count(
            format!(
                "{} communicator creations (created, after ops, after repeat)",
                g.name()
            ),
            [created, after, again] == want,
            format!("{:?} against {want:?}", [created, after, again]),
        );
    }
    let world_after = pg.nccl_comms_created();
    println!("SEED rank={rank} world before={world_before} after={world_after}");
    ck.count(
        "the world's creations unchanged by its subgroups".into(),
        world_after == world_before,
        format!("{world_before} before, {world_after} after"),
    );
    for g in &groups {
        g.shutdown()
            .await
            .map_err(|e| format!("{} shutdown: {e}", g.name()))?;
    }
    Ok(ck)
}
