//! A check of every op, for every dtype, against the serial reference.

use chorus::{ProcessGroup, ReduceOp};

use super::elems::{data, poison, reference, TestElem};

/// Sizes (in elements) the op checks use: 0, 1, a prime, and an uneven size
/// large enough for the ring path.
pub const SIZES: [usize; 5] = [0, 1, 13, 4099, 70_001];

/// Every reduce op.
pub const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

fn verify<T: TestElem>(what: String, got: &[T], want: &[T]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b);
    Err(match at {
        Some(i) => format!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        ),
        None => format!("{what}: length {} expected {}", got.len(), want.len()),
    })
}

/// Runs every op on this rank for element type `T` and `sizes`, checking
/// each result against the serial reference; every rank of the group must
/// call it with the same arguments. Returns the number of checks passed, or
/// the first failure.
pub async fn check_all_ops<T: TestElem>(
    pg: &ProcessGroup,
    salt: u64,
    sizes: &[usize],
) -> Result<usize, String> {
    let (rank, size) = (pg.rank(), pg.size());
    fn e<B>(f: chorus::Failed<B>) -> String {
        f.error.to_string()
    }
    let r = |e: chorus::Rejected<_>| e.error.to_string();
    let dt = T::DTYPE;
    let mut checks = 0;
    for (si, &len) in sizes.iter().enumerate() {
        let case = |k: u64| salt * 1_000 + si as u64 * 100 + k;
        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(oi as u64);
            let out = pg
                .all_reduce(data::<T>(c, rank, len, op), op)
                .map_err(r)?
                .await
                .map_err(e)?;
            verify(
                format!("all_reduce {op} {dt} len {len}"),
                &out,
                &reference::<T>(c, size, len, op),
            )?;
            checks += 1;
        }

        let c = case(10);
        let root = (c as usize) % size;
        let buf = if rank == root {
            data::<T>(c, rank, len, ReduceOp::Sum)
        } else {
            poison(len)
        };
        let out = pg
            .broadcast(buf, root)
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        verify(
            format!("broadcast {dt} len {len}"),
            &out,
            &data::<T>(c, root, len, ReduceOp::Sum),
        )?;
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(20 + oi as u64);
            let root = (c as usize + 1) % size;
            let mine = data::<T>(c, rank, len, op);
            let out = pg
                .reduce(mine.clone(), root, op)
                .map_err(|x| x.error.to_string())?
                .await
                .map_err(e)?;
            if rank == root {
                verify(
                    format!("reduce {op} {dt} len {len}"),
                    &out,
                    &reference::<T>(c, size, len, op),
                )?;
            } else {
                verify(
                    format!("reduce leaves non-root unchanged {dt}"),
                    &out,
                    &mine,
                )?;
            }
            checks += 1;
        }

        let c = case(30);
        let (inp, out) = pg
            .all_gather(data::<T>(c, rank, len, ReduceOp::Sum), poison(size * len))
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        verify(
            format!("all_gather input kept {dt}"),
            &inp,
            &data::<T>(c, rank, len, ReduceOp::Sum),
        )?;
        let expect: Vec<T> = (0..size)
            .flat_map(|r| data::<T>(c, r, len, ReduceOp::Sum))
            .collect();
        verify(format!("all_gather {dt} len {len}"), &out, &expect)?;
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(40 + oi as u64);
            let (_, out) = pg
                .reduce_scatter(data::<T>(c, rank, size * len, op), poison(len), op)
                .map_err(|x| x.error.to_string())?
                .await
                .map_err(e)?;
            let full = reference::<T>(c, size, size * len, op);
            verify(
                format!("reduce_scatter {op} {dt} len {len}"),
                &out,
                &full[rank * len..(rank + 1) * len],
            )?;
            checks += 1;
        }

        let c = case(50);
        let (_, out) = pg
            .all_to_all(
                data::<T>(c, rank, size * len, ReduceOp::Sum),
                poison(size * len),
            )
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        let expect: Vec<T> = (0..size)
            .flat_map(|i| {
                data::<T>(c, i, size * len, ReduceOp::Sum)[rank * len..(rank + 1) * len].to_vec()
            })
            .collect();
        verify(format!("all_to_all {dt} len {len}"), &out, &expect)?;
        checks += 1;

        if size > 1 {
            let c = case(60);
            let next = (rank + 1) % size;
            let prev = (rank + size - 1) % size;
            // Both submitted before either is awaited: eager submission.
            let s = pg
                .send(data::<T>(c, rank, len, ReduceOp::Sum), next)
                .map_err(r)?;
            let rv = pg.recv(poison::<T>(len), prev).map_err(r)?;
            let got = rv.await.map_err(e)?;
            s.await.map_err(e)?;
            verify(
                format!("send/recv {dt} len {len}"),
                &got,
                &data::<T>(c, prev, len, ReduceOp::Sum),
            )?;
            checks += 1;
        }
    }
    pg.barrier()
        .map_err(|x| x.error.to_string())?
        .await
        .map_err(e)?;
    Ok(checks + 1)
}

/// Elements of [`check_large_all_reduce`]'s f32 buffer: 8 MiB and 3
/// elements, so that with 4 or more ranks on a host with a 32 MiB
/// last-level cache the ranks' buffers together overflow it and the op
/// writes its result with streaming stores.
pub const LARGE: usize = (2 << 20) + 3;

/// An f32 all_reduce of `len` elements for every reduce op against the
/// serial reference; returns the checks passed.
pub async fn check_large_all_reduce(pg: &ProcessGroup, len: usize) -> Result<usize, String> {
    let (rank, size) = (pg.rank(), pg.size());
    for (oi, &op) in OPS.iter().enumerate() {
        let c = 90_000 + oi as u64;
        let out = pg
            .all_reduce(data::<f32>(c, rank, len, op), op)
            .map_err(|e| e.error.to_string())?
            .await
            .map_err(|f| f.error.to_string())?;
        verify(
            format!("all_reduce {op} f32 len {len}"),
            &out,
            &reference::<f32>(c, size, len, op),
        )?;
    }
    Ok(OPS.len())
}

/// [`check_all_ops`] for every dtype; returns the total checks passed.
pub async fn check_all_dtypes(pg: &ProcessGroup, sizes: &[usize]) -> Result<usize, String> {
    use half::{bf16, f16};
    let mut n = check_all_ops::<f32>(pg, 1, sizes).await?;
    n += check_all_ops::<f64>(pg, 2, sizes).await?;
    n += check_all_ops::<f16>(pg, 3, sizes).await?;
    n += check_all_ops::<bf16>(pg, 4, sizes).await?;
    n += check_all_ops::<i8>(pg, 5, sizes).await?;
    n += check_all_ops::<u8>(pg, 6, sizes).await?;
    n += check_all_ops::<i32>(pg, 7, sizes).await?;
    n += check_all_ops::<i64>(pg, 8, sizes).await?;
    Ok(n)
}
