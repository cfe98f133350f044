//! `matrix`: every op × reduce op × dtype on device buffers at several
//! lengths, a large f32 all_reduce, then subgroups made by `new_group`,
//! each checked against the serial reference.

use chorus::test_util::Reducible;
use chorus::{DeviceElement, ProcessGroup, ReduceOp, Stream};
use half::{bf16, f16};
use tests_integration::testkit::{data, poison, reference, TestElem, OPS};

use super::checker::Checker;
use super::support::{down, rej, up, werr, Res};

/// Every op for element type `T` at `len` elements per rank.
async fn ops<T>(pg: &ProcessGroup, s: &Stream, salt: u64, len: usize, ck: &mut Checker) -> Res<()>
where
    T: TestElem + Reducible + DeviceElement,
{
    let (rank, size) = (pg.rank(), pg.size());
    let dt = T::DTYPE;
    let case = |k: u64| salt * 1_000 + k;
    for (oi, &op) in OPS.iter().enumerate() {
        let c = case(oi as u64);
        let w = format!("all_reduce {op} {dt} len {len}");
        let b = pg
            .all_reduce(up(s, &data::<T>(c, rank, len, op))?, op)
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        ck.check_reduced(w, &down(&b)?, &reference::<T>(c, size, len, op), op, size);

        let c = case(20 + oi as u64);
        let root = (c as usize + 1) % size;
        let w = format!("reduce {op} {dt} len {len} root {root}");
        let b = pg
            .reduce(up(s, &data::<T>(c, rank, len, op))?, root, op)
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        if rank == root {
            ck.check_reduced(w, &down(&b)?, &reference::<T>(c, size, len, op), op, size);
        }

        let c = case(40 + oi as u64);
        let w = format!("reduce_scatter {op} {dt} len {len}");
        let (_, o) = pg
            .reduce_scatter(
                up(s, &data::<T>(c, rank, size * len, op))?,
                up(s, &poison::<T>(len))?,
                op,
            )
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        let full = reference::<T>(c, size, size * len, op);
        ck.check_reduced(w, &down(&o)?, &full[rank * len..(rank + 1) * len], op, size);
    }

    let c = case(10);
    let root = (c as usize) % size;
    let w = format!("broadcast {dt} len {len} root {root}");
    let mine = if rank == root {
        data::<T>(c, rank, len, ReduceOp::Sum)
    } else {
        poison(len)
    };
    let b = pg
        .broadcast(up(s, &mine)?, root)
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(w, &down(&b)?, &data::<T>(c, root, len, ReduceOp::Sum));

    let c = case(30);
    let w = format!("all_gather {dt} len {len}");
    let (i, o) = pg
        .all_gather(
            up(s, &data::<T>(c, rank, len, ReduceOp::Sum))?,
            up(s, &poison::<T>(size * len))?,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    let expect: Vec<T> = (0..size)
        .flat_map(|r| data::<T>(c, r, len, ReduceOp::Sum))
        .collect();
    ck.check(w.clone(), &down(&o)?, &expect);
    ck.check(
        format!("{w} input kept"),
        &down(&i)?,
        &data::<T>(c, rank, len, ReduceOp::Sum),
    );

    let c = case(50);
    let w = format!("all_to_all {dt} len {len}");
    let (_, o) = pg
        .all_to_all(
            up(s, &data::<T>(c, rank, size * len, ReduceOp::Sum))?,
            up(s, &poison::<T>(size * len))?,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    let expect: Vec<T> = (0..size)
        .flat_map(|i| {
            data::<T>(c, i, size * len, ReduceOp::Sum)[rank * len..(rank + 1) * len].to_vec()
        })
        .collect();
    ck.check(w, &down(&o)?, &expect);

    // send/recv: rank a sends to rank b, for every ordered pair in turn, so
    // that no rank posts a send and a recv on the same stream at once.
    for a in 0..size {
        for b in 0..size {
            if a == b {
                continue;
            }
            let c = case(60 + (a * size + b) as u64);
            let w = format!("send/recv {dt} len {len} {a}->{b}");
            if rank == a {
                pg.send(up(s, &data::<T>(c, a, len, ReduceOp::Sum))?, b)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
            } else if rank == b {
                let got = pg
                    .recv(up(s, &poison::<T>(len))?, a)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
                ck.check(w, &down(&got)?, &data::<T>(c, a, len, ReduceOp::Sum));
            }
        }
    }

    // send_recv: a ring exchange as one batched op per rank.
    if size > 1 {
        let c = case(90);
        let next = (rank + 1) % size;
        let prev = (rank + size - 1) % size;
        if size == 2 {
            let w = format!("send_recv {dt} len {len} with {next}");
            let (_, got) = pg
                .send_recv(
                    up(s, &data::<T>(c, rank, len, ReduceOp::Sum))?,
                    up(s, &poison::<T>(len))?,
                    next,
                )
                .map_err(rej(&w))?
                .await
                .map_err(werr(&w))?;
            ck.check(w, &down(&got)?, &data::<T>(c, prev, len, ReduceOp::Sum));
        }
    }
    Ok(())
}

async fn all_dtypes(pg: &ProcessGroup, s: &Stream, len: usize, ck: &mut Checker) -> Res<()> {
    let salt = len as u64 * 10;
    ops::<f32>(pg, s, salt + 1, len, ck).await?;
    ops::<f64>(pg, s, salt + 2, len, ck).await?;
    ops::<f16>(pg, s, salt + 3, len, ck).await?;
    ops::<bf16>(pg, s, salt + 4, len, ck).await?;
    ops::<i8>(pg, s, salt + 5, len, ck).await?;
    ops::<u8>(pg, s, salt + 6, len, ck).await?;
    ops::<i32>(pg, s, salt + 7, len, ck).await?;
    ops::<i64>(pg, s, salt + 8, len, ck).await?;
    Ok(())
}

pub(super) async fn matrix(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let rank = pg.rank();
    let mut ck = Checker::default();
    for len in [1usize, 13, 4099, 70_001] {
        all_dtypes(pg, s, len, &mut ck).await?;
    }
    // A large f32 all_reduce (4 Mi + 3 elements).
    ops_big(pg, s, &mut ck).await?;
    let world_comms = pg.nccl_comms_created();

    // Subgroups: the whole world (a split with every rank), then only the
    // last rank (the others take part in the split with NOCOLOR).
    let size = pg.size();
    let all: Vec<usize> = (0..size).collect();
    let sub = pg
        .new_group(&all)
        .await
        .map_err(|e| format!("new_group(all): {e}"))?
        .ok_or("new_group(all) gave no group to a member")?;
    let last = pg
        .new_group(&[size - 1])
        .await
        .map_err(|e| format!("new_group([last]): {e}"))?;
    for (name, g) in [("sub(all)", Some(&sub)), ("sub(last)", last.as_ref())] {
        let Some(g) = g else { continue };
        let c = 777 + g.size() as u64;
        let w = format!("{name} all_reduce sum f32 len 5003");
        let b = g
            .all_reduce(
                up(s, &data::<f32>(c, g.rank(), 5003, ReduceOp::Sum))?,
                ReduceOp::Sum,
            )
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        ck.check(
            w,
            &down(&b)?,
            &reference::<f32>(c, g.size(), 5003, ReduceOp::Sum),
        );
        println!(
            "SUBGROUP rank={rank} {name} size={} sub_rank={} comms_created={}",
            g.size(),
            g.rank(),
            g.nccl_comms_created()
        );
    }
    println!(
        "COMMS rank={rank} world={world_comms} after_subgroups={}",
        pg.nccl_comms_created()
    );
    pg.barrier()
        .map_err(rej("barrier"))?
        .await
        .map_err(werr("barrier"))?;
    Ok(ck)
}

async fn ops_big(pg: &ProcessGroup, s: &Stream, ck: &mut Checker) -> Res<()> {
    let (rank, size) = (pg.rank(), pg.size());
    let len = (4 << 20) + 3;
    let w = format!("all_reduce sum f32 len {len}");
    let b = pg
        .all_reduce(
            up(s, &data::<f32>(4242, rank, len, ReduceOp::Sum))?,
            ReduceOp::Sum,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(
        w,
        &down(&b)?,
        &reference::<f32>(4242, size, len, ReduceOp::Sum),
    );
    Ok(())
}
