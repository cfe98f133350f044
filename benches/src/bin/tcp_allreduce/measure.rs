//! The timed loop of one message size and its JSON line.

use std::time::{Duration, Instant};

use chorus::{ProcessGroup, ReduceOp, TcpOptions};

use crate::Args;

/// The op measured.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Bench {
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

    /// nccl-tests' bus bandwidth factor: 2(n-1)/n of the bytes for
    /// all_reduce, the bytes for broadcast.
    fn busbw_factor(self, n: usize) -> f64 {
        match self {
            Bench::AllReduce => 2.0 * (n as f64 - 1.0) / n as f64,
            Bench::Broadcast => 1.0,
        }
    }
}

/// How an op is timed (see `--timing`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Timing {
    Barrier,
    Loop,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// CPU time (user and system) of this process so far.
fn cpu_time() -> Duration {
    let Ok(u) = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

/// Warms up, times the op on `bytes` (every iteration after a barrier,
/// as long as the slowest rank's), and prints rank 0's JSON line.
pub(crate) async fn size(
    pg: &ProcessGroup,
    args: &Args,
    opts: &TcpOptions,
    bytes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = pg.size();
    let count = (bytes / 4).max(1);
    let mut buf: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
    for _ in 0..args.warmup {
        buf = args.op.run(pg, buf)?.await?;
    }
    // Every rank runs the same number of iterations: rank 0 decides from
    // its warm-up time and broadcasts it.
    let t0 = Instant::now();
    buf = args.op.run(pg, buf)?.await?;
    let one = t0.elapsed().as_secs_f64().max(1e-6);
    let want = ((args.budget_s / one) as usize).clamp(5, args.iters) as i64;
    let iters = pg.broadcast(vec![want], 0)?.await?[0] as usize;
    let mut times = Vec::with_capacity(iters);
    let late = Duration::from_millis(args.late_ms);
    let cpu0 = cpu_time();
    let wall0 = Instant::now();
    for _ in 0..iters {
        pg.barrier()?.await?;
        let t = Instant::now();
        if !late.is_zero() && pg.rank() + 1 == n {
            // The last rank comes late: the others wait for it.
            tokio::time::sleep(late).await;
        }
        buf = args.op.run(pg, buf)?.await?;
        times.push(t.elapsed());
    }
    let cpu = (cpu_time() - cpu0).as_secs_f64();
    let wall = wall0.elapsed().as_secs_f64();
    // Keep values bounded so repeated sums stay finite.
    buf.iter_mut().for_each(|x| *x = 1.0);
    drop(buf);
    // Each rank's times, then its CPU time, gathered on every rank.
    let mut mine: Vec<f64> = times.iter().map(|d| d.as_secs_f64()).collect();
    mine.push(cpu);
    let all = pg.all_gather(mine, vec![0.0; (iters + 1) * n])?.await?.1;
    if pg.rank() != 0 {
        return Ok(());
    }
    let row = |r: usize| &all[r * (iters + 1)..(r + 1) * (iters + 1)];
    // The op's time is the slowest rank's, per iteration.
    let mut per_iter: Vec<Duration> = (0..iters)
        .map(|i| Duration::from_secs_f64((0..n).map(|r| row(r)[i]).fold(0.0, f64::max)))
        .collect();
    per_iter.sort();
    let med = percentile(&per_iter, 0.5);
    let p99 = percentile(&per_iter, 0.99);
    let cpu_us = (0..n).map(|r| row(r)[iters]).sum::<f64>() / iters as f64 * 1e6;
    let busbw = (count * 4) as f64 * args.op.busbw_factor(n) / med.as_secs_f64() / 1e9;
    // Rank 0's share of a core over the loop: with `--late-ms`, what a
    // rank costs while it waits for a late peer.
    let cpu0_pct = row(0)[iters] / wall.max(1e-9) * 100.0;
    println!(
        "{{\"impl\":\"chorus\",\"late_ms\":{},\"rank0_cpu_pct\":{cpu0_pct:.1},\"op\":\"{}\",\"checked\":{},\"algorithm\":\"{}\",\"transport\":\"{}\",\"chunk_bytes\":{},\"ranks\":{n},\"bytes\":{},\"iters\":{iters},\"median_us\":{:.1},\"p99_us\":{:.1},\"busbw_gbps\":{:.3},\"cpu_us\":{:.1}}}",
        args.late_ms,
        args.op.name(),
        std::env::var("CHORUS_CHECK_OPS").is_ok_and(|v| v == "1"),
        format!("{:?}", args.algorithm).to_lowercase(),
        if opts.local_unix_sockets { "unix" } else { "tcp" },
        opts.chunk_bytes,
        count * 4,
        med.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
        busbw,
        cpu_us
    );
    Ok(())
}

/// Warms up, then times `--rounds` rounds of back-to-back ops after a
/// barrier (osu_allreduce's way): a round's figure is the slowest rank's
/// mean time per op; prints rank 0's JSON line with the median round.
pub(crate) async fn size_loop(
    pg: &ProcessGroup,
    args: &Args,
    opts: &TcpOptions,
    bytes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = pg.size();
    let count = (bytes / 4).max(1);
    let mut buf: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
    for _ in 0..args.warmup {
        buf = args.op.run(pg, buf)?.await?;
    }
    let t0 = Instant::now();
    buf = args.op.run(pg, buf)?.await?;
    let one = t0.elapsed().as_secs_f64().max(1e-6);
    let rounds = args.rounds.max(1);
    // The budget is for all rounds together; every rank runs rank 0's count.
    let want = ((args.budget_s / rounds as f64 / one) as usize).clamp(5, args.iters * 10) as i64;
    let iters = pg.broadcast(vec![want], 0)?.await?[0] as usize;
    let cpu0 = cpu_time();
    let mut mine = Vec::with_capacity(rounds + 1);
    for _ in 0..rounds {
        pg.barrier()?.await?;
        let t = Instant::now();
        for _ in 0..iters {
            buf = args.op.run(pg, buf)?.await?;
        }
        mine.push(t.elapsed().as_secs_f64() / iters as f64);
        buf.iter_mut().for_each(|x| *x = 1.0);
    }
    mine.push((cpu_time() - cpu0).as_secs_f64() / (iters * rounds) as f64);
    drop(buf);
    let all = pg.all_gather(mine, vec![0.0; (rounds + 1) * n])?.await?.1;
    if pg.rank() != 0 {
        return Ok(());
    }
    let row = |r: usize| &all[r * (rounds + 1)..(r + 1) * (rounds + 1)];
    let mut per_round: Vec<f64> = (0..rounds)
        .map(|i| (0..n).map(|r| row(r)[i]).fold(0.0, f64::max))
        .collect();
    let rounds_us: Vec<String> = per_round
        .iter()
        .map(|s| format!("{:.2}", s * 1e6))
        .collect();
    per_round.sort_by(f64::total_cmp);
    let med = per_round[per_round.len() / 2];
    let cpu_us = (0..n).map(|r| row(r)[rounds]).sum::<f64>() * 1e6;
    let busbw = (count * 4) as f64 * args.op.busbw_factor(n) / med / 1e9;
    println!(
        "{{\"impl\":\"chorus\",\"timing\":\"loop\",\"op\":\"{}\",\"transport\":\"{}\",\"chunk_bytes\":{},\"ranks\":{n},\"bytes\":{},\"iters\":{iters},\"median_us\":{:.2},\"rounds_us\":[{}],\"busbw_gbps\":{:.3},\"cpu_us\":{:.1}}}",
        args.op.name(),
        if opts.local_unix_sockets { "unix" } else { "tcp" },
        opts.chunk_bytes,
        count * 4,
        med * 1e6,
        rounds_us.join(","),
        busbw,
        cpu_us
    );
    Ok(())
}
