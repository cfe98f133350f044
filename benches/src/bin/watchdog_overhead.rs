//! The watchdog's cost and speed on one GPU (a 1-rank device group):
//!
//! * overhead: throughput of `--ops` small awaited `all_reduce`s
//!   (`block_on`, GPU finished each time), `--reps` times; run the binary
//!   once with the watchdog on and once with `CHORUS_WATCHDOG=0` (off) and
//!   compare `ops_per_s_median`; or, in one process, `--interleave N`
//!   blocks alternating the watchdog's rounds paused and running, which
//!   reports the mean cost over the pairs of blocks with its 95%
//!   confidence interval;
//! * detection latency (watchdog on only): a spin kernel holds the producer
//!   stream longer than the op timeout; time from the op's deadline to the
//!   awaited work failing with `OpTimeout`, over `--detect-trials` fresh
//!   groups (each timed-out group is aborted).
//!
//! Prints one JSON line on stdout. Needs a CUDA GPU and NCCL.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use chorus::watchdog;
use chorus::{DeviceBuffer, Failed, ReduceOp, WorkError};
use chorus_gpu::cuda::kernels::Kernels;
use chorus_gpu::cuda::{Device, StreamPriority};
use clap::Parser;
use futures::executor::block_on;

#[derive(Parser, Debug)]
#[command(about = "watchdog overhead and detection latency (1-rank group on device 0)")]
struct Args {
    /// Awaited all_reduces per repetition.
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Repetitions of the throughput loop.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Elements (f32) of the small message.
    #[arg(long, default_value_t = 256)]
    count: usize,
    /// Detection-latency trials (skipped when the watchdog is off).
    #[arg(long, default_value_t = 10)]
    detect_trials: usize,
    /// Op timeout of the detection trials, in milliseconds.
    #[arg(long, default_value_t = 100)]
    detect_timeout_ms: u64,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// In-process A/B: this many blocks of `--ops` ops, alternating the
    /// watchdog's rounds paused and running (0: off).
    #[arg(long, default_value_t = 0)]
    interleave: usize,
    /// Sleep this long before exiting (lets background NCCL abort threads
    /// finish).
    #[arg(long, default_value_t = 0)]
    exit_sleep_ms: u64,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Mean of `v` and the half-width of its 95% confidence interval
/// (Student's t with `n - 1` degrees of freedom; NaN below two samples).
fn mean_ci95(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.len() < 2 {
        return (v.first().copied().unwrap_or(f64::NAN), f64::NAN);
    }
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, t975(n - 1.0) * (var / n).sqrt())
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom: the
/// normal quantile with the Cornish-Fisher correction terms (within 1% of
/// the tables from 5 degrees of freedom on, 0.1% from 10).
fn t975(df: f64) -> f64 {
    let z: f64 = 1.959_964;
    let (z3, z5) = (z.powi(3), z.powi(5));
    z + (z3 + z) / (4.0 * df) + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df * df)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dev = Device::get(args.device)?;
    let producer = dev.new_stream(StreamPriority::Normal)?;
    let pg = chorus::test_util::one_rank_group("overhead", args.device)?;
    let on = watchdog::enabled();
    let mut buf = DeviceBuffer::new(producer.clone_htod(&vec![1f32; args.count])?)?;
    for _ in 0..2000 {
        buf = block_on(pg.all_reduce(buf, ReduceOp::Sum)?)?;
    }
    if args.interleave > 0 {
        // Blocks alternate paused / running; a pair's order alternates too.
        let (mut run, mut paused) = (Vec::new(), Vec::new());
        for i in 0..args.interleave {
            let pause = (i % 2 == 0) == (i / 2 % 2 == 0);
            chorus::test_util::set_paused(pause);
            let r0 = watchdog::stats().rounds;
            let t0 = Instant::now();
            for _ in 0..args.ops {
                buf = block_on(pg.all_reduce(buf, ReduceOp::Sum)?)?;
            }
            let rate = args.ops as f64 / t0.elapsed().as_secs_f64();
            let rounds = watchdog::stats().rounds - r0;
            if pause {
                paused.push(rate)
            } else {
                run.push((rate, rounds))
            }
        }
        chorus::test_util::set_paused(false);
        let mut r: Vec<f64> = run.iter().map(|x| x.0).collect();
        let mut p = paused.clone();
        let (mr, mp) = (median(&mut r), median(&mut p));
        // Each pair of neighbouring blocks holds one of each: the pair's
        // relative cost is one sample; their mean and its 95% interval.
        let costs: Vec<f64> = run
            .iter()
            .zip(&paused)
            .map(|(r, p)| (p - r.0) / p * 100.0)
            .collect();
        let (mean, half) = mean_ci95(&costs);
        println!(
            "{{\"mode\":\"interleave\",\"blocks\":{},\"ops\":{},\"running_median\":{mr:.0},\"paused_median\":{mp:.0},\"cost_pct\":{:.2},\"pairs\":{},\"cost_mean_pct\":{mean:.2},\"cost_ci95_pct\":[{:.2},{:.2}],\"running\":{:?},\"paused\":{:?}}}",
            args.interleave,
            args.ops,
            (mp - mr) / mp * 100.0,
            costs.len(),
            mean - half,
            mean + half,
            run.iter().map(|x| x.0.round()).collect::<Vec<_>>(),
            paused.iter().map(|x| x.round()).collect::<Vec<_>>()
        );
        return Ok(());
    }
    let rounds0 = watchdog::stats().rounds;
    let mut rates = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let t0 = Instant::now();
        for _ in 0..args.ops {
            buf = block_on(pg.all_reduce(buf, ReduceOp::Sum)?)?;
        }
        rates.push(args.ops as f64 / t0.elapsed().as_secs_f64());
    }
    let rounds = watchdog::stats().rounds - rounds0;
    let check = producer.clone_dtoh(buf.slice())?;
    if !check.iter().all(|&x| x == 1.0) {
        return Err("sum over 1 rank changed the data".into());
    }
    let rates_json: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    let ops_med = median(&mut rates.clone());
    drop(pg);

    // Detection latency.
    let mut lat = Vec::new();
    if on {
        let kernels = Kernels::load(&dev)?;
        let timeout = Duration::from_millis(args.detect_timeout_ms);
        for i in 0..args.detect_trials {
            let g = chorus::test_util::one_rank_group(&format!("detect-{i}"), args.device)?
                .with_timeout(timeout);
            let b = DeviceBuffer::new(producer.clone_htod(&vec![1f32; args.count])?)?;
            producer.synchronize()?;
            kernels.spin(&producer, timeout * 3)?;
            let t0 = Instant::now();
            let r = block_on(g.all_reduce(b, ReduceOp::Sum)?).map_err(Failed::into_error);
            let took = t0.elapsed();
            match r {
                Err(WorkError::OpTimeout { .. }) => {
                    lat.push(took.saturating_sub(timeout).as_secs_f64() * 1e3)
                }
                Err(e) => return Err(format!("trial {i}: unexpected error {e}").into()),
                Ok(_) => return Err(format!("trial {i}: the op did not time out").into()),
            }
            producer.synchronize()?;
        }
    }
    let lat_json: Vec<String> = lat.iter().map(|l| format!("{l:.3}")).collect();
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "null".to_string()
        }
    };
    let lat_max = num(lat.iter().copied().fold(f64::NAN, f64::max));
    let lat_med = num(median(&mut lat.clone()));
    let interval = watchdog::WatchdogConfig::from_env().interval.as_millis();
    println!(
        "{{\"watchdog\":{on},\"interval_ms\":{interval},\"ops\":{},\"count\":{},\"ops_per_s\":[{}],\"ops_per_s_median\":{ops_med:.0},\"watchdog_rounds_during_loop\":{rounds},\"detect_timeout_ms\":{},\"detect_latency_ms\":[{}],\"detect_latency_median_ms\":{lat_med},\"detect_latency_max_ms\":{lat_max}}}",
        args.ops,
        args.count,
        rates_json.join(","),
        args.detect_timeout_ms,
        lat_json.join(","),
    );
    std::thread::sleep(Duration::from_millis(args.exit_sleep_ms));
    Ok(())
}
