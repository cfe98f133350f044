//! chorus quickstart: several local ranks run every collective on random
//! data at several sizes, check every result against a serial reference,
//! and print each op's median and p99 latency and its bus bandwidth.
//!
//! ```sh
//! # launches 4 ranks of itself (on the TCP backend when there is no GPU)
//! cargo run --release -p chorus-examples --example quickstart -- --nproc 4
//! # or under the launcher (or torchrun --no-python, or srun)
//! chorus-run --nproc-per-node 4 -- target/release/examples/quickstart
//! ```
#![forbid(unsafe_code)]

use chorus::test_util::reference_reduce;
use chorus::{ProcessGroup, ReduceOp};
use chorus_examples::busbw::Collective;
use chorus_examples::report::{gather, row, Row};
use chorus_examples::timed::{timed, Plan};
use chorus_examples::{launch_self_if_needed, rank_data};
use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(about = "Run every chorus collective across local ranks, check and time the results")]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 4)]
    nproc: usize,
    /// Small sizes and few iterations (for CI).
    #[arg(long)]
    quick: bool,
    /// Timed iterations per op and size [default: 20, 5 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Untimed (but checked) iterations before them [default: 3, 1 with --quick].
    #[arg(long)]
    warmup: Option<u64>,
    /// Check every timed iteration's result, not only the last one's (the
    /// checks then push the op's buffers out of the caches between
    /// iterations, which shows in the times); --quick always does.
    #[arg(long)]
    check_all: bool,
}

/// Elements (f32) of each rank's part: odd counts too, so that chunks do
/// not divide evenly.
const SIZES: [usize; 4] = [1, 1000, 65_537, 1 << 20];
const QUICK_SIZES: [usize; 3] = [1, 1000, 65_537];

fn inputs(case: u64, n: usize, len: usize) -> Vec<Vec<f32>> {
    (0..n).map(|r| rank_data(case, r, len)).collect()
}

async fn all_reduce(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let mine = rank_data(case, pg.rank(), len);
    let expect = reference_reduce(ReduceOp::Sum, &inputs(case, pg.size(), len));
    let t = timed(
        pg,
        plan,
        || mine.clone(),
        |b| Ok(pg.all_reduce(b, ReduceOp::Sum)?),
        |out| Some(*out == expect),
    )
    .await?;
    Ok(row(Collective::AllReduce, len, t))
}

async fn broadcast(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let root = pg.size() - 1;
    let expect = rank_data(case, root, len);
    let t = timed(
        pg,
        plan,
        || {
            if pg.rank() == root {
                expect.clone()
            } else {
                vec![f32::NAN; len]
            }
        },
        |b| Ok(pg.broadcast(b, root)?),
        |out| Some(*out == expect),
    )
    .await?;
    Ok(row(Collective::Broadcast, len, t))
}

async fn reduce(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let mine = rank_data(case, pg.rank(), len);
    let expect = reference_reduce(ReduceOp::Max, &inputs(case, pg.size(), len));
    // Only the root's result is defined.
    let t = timed(
        pg,
        plan,
        || mine.clone(),
        |b| Ok(pg.reduce(b, 0, ReduceOp::Max)?),
        |out| (pg.rank() == 0).then(|| *out == expect),
    )
    .await?;
    Ok(row(Collective::Reduce, len, t))
}

async fn all_gather(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let n = pg.size();
    let mine = rank_data(case, pg.rank(), len);
    let expect: Vec<f32> = inputs(case, n, len).concat();
    let t = timed(
        pg,
        plan,
        || (mine.clone(), vec![f32::NAN; n * len]),
        |(i, o)| Ok(pg.all_gather(i, o)?),
        |(_, out)| Some(*out == expect),
    )
    .await?;
    Ok(row(Collective::AllGather, len, t))
}

async fn reduce_scatter(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let (rank, n) = (pg.rank(), pg.size());
    let mine = rank_data(case, rank, n * len);
    let full = reference_reduce(ReduceOp::Sum, &inputs(case, n, n * len));
    let expect = &full[rank * len..(rank + 1) * len];
    let t = timed(
        pg,
        plan,
        || (mine.clone(), vec![f32::NAN; len]),
        |(i, o)| Ok(pg.reduce_scatter(i, o, ReduceOp::Sum)?),
        |(_, out)| Some(out[..] == *expect),
    )
    .await?;
    Ok(row(Collective::ReduceScatter, len, t))
}

async fn all_to_all(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let (rank, n) = (pg.rank(), pg.size());
    let mine = rank_data(case, rank, n * len);
    let expect: Vec<f32> = inputs(case, n, n * len)
        .iter()
        .flat_map(|from| from[rank * len..(rank + 1) * len].to_vec())
        .collect();
    let t = timed(
        pg,
        plan,
        || (mine.clone(), vec![f32::NAN; n * len]),
        |(i, o)| Ok(pg.all_to_all(i, o)?),
        |(_, out)| Some(*out == expect),
    )
    .await?;
    Ok(row(Collective::AllToAll, len, t))
}

/// A send to the next rank and a recv from the previous one, around a ring.
async fn send_recv(
    pg: &ProcessGroup,
    plan: Plan,
    case: u64,
    len: usize,
) -> Result<Row, chorus::Error> {
    let (rank, n) = (pg.rank(), pg.size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mine = rank_data(case, rank, len);
    let expect = rank_data(case, prev, len);
    let t = timed(
        pg,
        plan,
        || (mine.clone(), vec![f32::NAN; len]),
        |(s, r)| {
            let (s, r) = (pg.send(s, next)?, pg.recv(r, prev)?);
            Ok(async move {
                let got = r.await?;
                s.await?;
                Ok::<_, chorus::WorkError>(got)
            })
        },
        |got| Some(*got == expect),
    )
    .await?;
    Ok(row(Collective::SendRecv, len, t))
}

async fn run(pg: &ProcessGroup, sizes: &[usize], plan: Plan) -> Result<Vec<Row>, chorus::Error> {
    let mut rows = Vec::new();
    let mut case = 0u64;
    let mut next = || {
        case += 1;
        case
    };
    for &len in sizes {
        rows.push(all_reduce(pg, plan, next(), len).await?);
        rows.push(broadcast(pg, plan, next(), len).await?);
        rows.push(reduce(pg, plan, next(), len).await?);
        rows.push(all_gather(pg, plan, next(), len).await?);
        rows.push(reduce_scatter(pg, plan, next(), len).await?);
        rows.push(all_to_all(pg, plan, next(), len).await?);
        if pg.size() > 1 {
            rows.push(send_recv(pg, plan, next(), len).await?);
        }
    }
    let t = timed(pg, plan, || (), |()| Ok(pg.barrier()?), |_| None).await?;
    rows.push(row(Collective::Barrier, 0, t));
    Ok(rows)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(code) = launch_self_if_needed(args.nproc) {
        return code;
    }
    let (sizes, warmup, iters): (&[usize], _, _) = if args.quick {
        (&QUICK_SIZES, 1, 5)
    } else {
        (&SIZES, 3, 20)
    };
    let plan = Plan {
        warmup: args.warmup.map_or(warmup, |w| w as usize),
        iters: args.iters.map_or(iters, |i| i as usize),
        check_all: args.check_all || args.quick,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        let pg = ProcessGroup::init_from_env().await?;
        let rows = run(&pg, sizes, plan).await?;
        let report = gather(&pg, plan, rows).await?;
        // Leave together: rank 0 keeps the store (and its sockets) up until
        // every rank is done.
        pg.shutdown().await?;
        Ok::<_, chorus::Error>((pg.rank(), report))
    });
    match result {
        Ok((rank, report)) => {
            if rank == 0 {
                report.print();
            }
            if report.wrong() == 0 {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("quickstart failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
