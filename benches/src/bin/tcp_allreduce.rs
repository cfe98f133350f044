//! All-reduce (or broadcast, `--op broadcast`) latency and bus bandwidth of
//! the TCP backend, one rank per process (start it with chorus-run). Rank 0
//! prints one JSON line per size:
//! `{"impl":"chorus","op":..,"checked":..,"ranks":N,"bytes":B,"median_us":..,"p99_us":..,"busbw_gbps":..}`.
//! `CHORUS_CHECK_OPS=1` on every rank measures the checked mode.
//!
//! ```sh
//! target/release/chorus-run --nproc-per-node 2 -- target/release/tcp_allreduce --sizes 4,65536,16777216
//! ```
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use chorus::{ProcessGroup, ReduceOp};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Message sizes in bytes (f32 elements = bytes / 4).
    #[arg(long, value_delimiter = ',', default_value = "4,65536,16777216")]
    sizes: Vec<usize>,
    /// Warm-up iterations per size.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed iterations per size (fewer are run for large sizes, at least 5).
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Time budget per size in seconds.
    #[arg(long, default_value_t = 3.0)]
    budget_s: f64,
    /// The op: `all_reduce` (sum) or `broadcast` (from rank 0).
    #[arg(long, default_value = "all_reduce")]
    op: Bench,
}

/// The op measured.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Bench {
    #[value(name = "all_reduce")]
    AllReduce,
    #[value(name = "broadcast")]
    Broadcast,
}

impl Bench {
    fn run(
        self,
        pg: &ProcessGroup,
        buf: Vec<f32>,
    ) -> Result<chorus::Work<Vec<f32>>, chorus::Rejected<Vec<f32>>> {
        match self {
            Bench::AllReduce => pg.all_reduce(buf, ReduceOp::Sum),
            Bench::Broadcast => pg.broadcast(buf, 0),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Bench::AllReduce => "all_reduce",
            Bench::Broadcast => "broadcast",
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pg = ProcessGroup::init_from_env().await?;
    let n = pg.size();
    for &bytes in &args.sizes {
        let count = (bytes / 4).max(1);
        let mut buf: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
        for _ in 0..args.warmup {
            buf = args.op.run(&pg, buf)?.await?;
        }
        // Every rank runs the same number of iterations: rank 0 decides from
        // its warm-up time and broadcasts it.
        let t0 = Instant::now();
        buf = args.op.run(&pg, buf)?.await?;
        let one = t0.elapsed().as_secs_f64().max(1e-6);
        let want = ((args.budget_s / one) as usize).clamp(5, args.iters) as i64;
        let iters = pg.broadcast(vec![want], 0)?.await?[0] as usize;
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            pg.barrier()?.await?;
            let t = Instant::now();
            buf = args.op.run(&pg, buf)?.await?;
            times.push(t.elapsed());
        }
        // Keep values bounded so repeated sums stay finite.
        buf.iter_mut().for_each(|x| *x = 1.0);
        let times = pg
            .all_gather(
                times.iter().map(|d| d.as_secs_f64()).collect::<Vec<f64>>(),
                vec![0.0; iters * n],
            )?
            .await?
            .1;
        if pg.rank() == 0 {
            // The op's time is the slowest rank's, per iteration.
            let mut per_iter: Vec<Duration> = (0..iters)
                .map(|i| {
                    Duration::from_secs_f64(
                        (0..n).map(|r| times[r * iters + i]).fold(0.0, f64::max),
                    )
                })
                .collect();
            per_iter.sort();
            let med = percentile(&per_iter, 0.5);
            let p99 = percentile(&per_iter, 0.99);
            // nccl-tests' bus bandwidth: 2(n-1)/n of the bytes for
            // all_reduce, the bytes for broadcast.
            let factor = match args.op {
                Bench::AllReduce => 2.0 * (n as f64 - 1.0) / n as f64,
                Bench::Broadcast => 1.0,
            };
            let busbw = (count * 4) as f64 * factor / med.as_secs_f64() / 1e9;
            println!(
                "{{\"impl\":\"chorus\",\"op\":\"{}\",\"checked\":{},\"ranks\":{n},\"bytes\":{},\"iters\":{iters},\"median_us\":{:.1},\"p99_us\":{:.1},\"busbw_gbps\":{:.3}}}",
                args.op.name(),
                std::env::var("CHORUS_CHECK_OPS").is_ok_and(|v| v == "1"),
                count * 4,
                med.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                busbw
            );
        }
    }
    pg.shutdown().await?;
    Ok(())
}
