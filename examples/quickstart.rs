//! chorus quickstart: several local ranks run every collective on random
//! data, check each result against a serial reference, and print a table.
//!
//! ```sh
//! # launches 4 ranks of itself (on the TCP backend when there is no GPU)
//! cargo run --release -p chorus-examples --example quickstart -- --nproc 4
//! # or under the launcher (or torchrun --no-python, or srun)
//! chorus-run --nproc-per-node 4 -- target/release/examples/quickstart
//! ```
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use chorus::reduce::reference_reduce;
use chorus::{ProcessGroup, ReduceOp};
use chorus_examples::{launch_self_if_needed, rank_data};
use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(about = "Run every chorus collective across local ranks and check the results")]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 4)]
    nproc: usize,
    /// Small sizes and few iterations (for CI).
    #[arg(long)]
    quick: bool,
}

struct Row {
    op: &'static str,
    bytes: usize,
    time: Duration,
    ok: bool,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn run(pg: &ProcessGroup, quick: bool) -> Result<Vec<Row>, chorus::Error> {
    let (rank, n) = (pg.rank(), pg.size());
    let sizes: &[usize] = if quick {
        &[1, 1000, 65_537]
    } else {
        &[1, 1000, 65_537, 1 << 22]
    };
    let iters = if quick { 3 } else { 10 };
    let mut rows = Vec::new();
    let mut case = 0u64;
    for &len in sizes {
        // all_reduce (sum)
        case += 1;
        let expect = reference_reduce(
            ReduceOp::Sum,
            &(0..n).map(|r| rank_data(case, r, len)).collect::<Vec<_>>(),
        );
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let t = Instant::now();
            let out = pg
                .all_reduce(rank_data(case, rank, len), ReduceOp::Sum)?
                .await?;
            times.push(t.elapsed());
            ok &= out == expect;
        }
        rows.push(Row {
            op: "all_reduce",
            bytes: len * 4,
            time: median(times),
            ok,
        });

        // broadcast from the last rank
        case += 1;
        let root = n - 1;
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let buf = if rank == root {
                rank_data(case, rank, len)
            } else {
                vec![f32::NAN; len]
            };
            let t = Instant::now();
            let out = pg.broadcast(buf, root)?.await?;
            times.push(t.elapsed());
            ok &= out == rank_data(case, root, len);
        }
        rows.push(Row {
            op: "broadcast",
            bytes: len * 4,
            time: median(times),
            ok,
        });

        // reduce (max) to rank 0
        case += 1;
        let expect = reference_reduce(
            ReduceOp::Max,
            &(0..n).map(|r| rank_data(case, r, len)).collect::<Vec<_>>(),
        );
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let t = Instant::now();
            let out = pg
                .reduce(rank_data(case, rank, len), 0, ReduceOp::Max)?
                .await?;
            times.push(t.elapsed());
            ok &= rank != 0 || out == expect;
        }
        rows.push(Row {
            op: "reduce",
            bytes: len * 4,
            time: median(times),
            ok,
        });

        // all_gather
        case += 1;
        let expect: Vec<f32> = (0..n).flat_map(|r| rank_data(case, r, len)).collect();
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let t = Instant::now();
            let (_, out) = pg
                .all_gather(rank_data(case, rank, len), vec![f32::NAN; n * len])?
                .await?;
            times.push(t.elapsed());
            ok &= out == expect;
        }
        rows.push(Row {
            op: "all_gather",
            bytes: len * 4 * n,
            time: median(times),
            ok,
        });

        // reduce_scatter (sum)
        case += 1;
        let full = reference_reduce(
            ReduceOp::Sum,
            &(0..n)
                .map(|r| rank_data(case, r, n * len))
                .collect::<Vec<_>>(),
        );
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let t = Instant::now();
            let (_, out) = pg
                .reduce_scatter(
                    rank_data(case, rank, n * len),
                    vec![f32::NAN; len],
                    ReduceOp::Sum,
                )?
                .await?;
            times.push(t.elapsed());
            ok &= out[..] == full[rank * len..(rank + 1) * len];
        }
        rows.push(Row {
            op: "reduce_scatter",
            bytes: len * 4 * n,
            time: median(times),
            ok,
        });

        // all_to_all
        case += 1;
        let expect: Vec<f32> = (0..n)
            .flat_map(|i| rank_data(case, i, n * len)[rank * len..(rank + 1) * len].to_vec())
            .collect();
        let (mut times, mut ok) = (Vec::new(), true);
        for _ in 0..iters {
            let t = Instant::now();
            let (_, out) = pg
                .all_to_all(rank_data(case, rank, n * len), vec![f32::NAN; n * len])?
                .await?;
            times.push(t.elapsed());
            ok &= out == expect;
        }
        rows.push(Row {
            op: "all_to_all",
            bytes: len * 4 * n,
            time: median(times),
            ok,
        });

        // send/recv around a ring
        if n > 1 {
            case += 1;
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            let (mut times, mut ok) = (Vec::new(), true);
            for _ in 0..iters {
                let t = Instant::now();
                let s = pg.send(rank_data(case, rank, len), next)?;
                let r = pg.recv(vec![f32::NAN; len], prev)?;
                let got = r.await?;
                s.await?;
                times.push(t.elapsed());
                ok &= got == rank_data(case, prev, len);
            }
            rows.push(Row {
                op: "send/recv",
                bytes: len * 4,
                time: median(times),
                ok,
            });
        }
    }
    let (mut times, mut ok) = (Vec::new(), true);
    for _ in 0..iters {
        let t = Instant::now();
        ok &= pg.barrier()?.await.is_ok();
        times.push(t.elapsed());
    }
    rows.push(Row {
        op: "barrier",
        bytes: 0,
        time: median(times),
        ok,
    });
    Ok(rows)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(code) = launch_self_if_needed(args.nproc) {
        return code;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        let pg = ProcessGroup::init_from_env().await?;
        let rows = run(&pg, args.quick).await?;
        // Every rank's verdict, gathered so rank 0 reports them all.
        let oks: Vec<u8> = rows.iter().map(|r| r.ok as u8).collect();
        let (_, all) = pg
            .all_gather(oks.clone(), vec![0u8; oks.len() * pg.size()])?
            .await?;
        // Leave together: rank 0 keeps the store (and its sockets) up until
        // every rank is done.
        pg.shutdown().await?;
        Ok::<_, chorus::Error>((pg.rank(), pg.size(), pg.backend_name(), rows, all))
    });
    match result {
        Ok((rank, n, backend, rows, all)) => {
            let all_ok = all.iter().all(|&v| v == 1);
            if rank == 0 {
                println!("chorus quickstart: {n} ranks, backend {backend}, f32");
                println!(
                    "{:<15} {:>10} {:>12} {:>12} {:>4}",
                    "op", "size", "time", "bandwidth", "OK"
                );
                for (i, r) in rows.iter().enumerate() {
                    let ok = (0..n).all(|k| all[k * rows.len() + i] == 1);
                    let bw = if r.bytes == 0 {
                        "-".to_string()
                    } else {
                        format!("{:.3} GB/s", r.bytes as f64 / r.time.as_secs_f64() / 1e9)
                    };
                    println!(
                        "{:<15} {:>10} {:>9.1} µs {:>12} {:>4}",
                        r.op,
                        human(r.bytes),
                        r.time.as_secs_f64() * 1e6,
                        bw,
                        if ok { "OK" } else { "FAIL" }
                    );
                }
                println!(
                    "{}",
                    if all_ok {
                        "all results match the serial reference"
                    } else {
                        "SOME RESULTS ARE WRONG"
                    }
                );
            }
            if all_ok {
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
