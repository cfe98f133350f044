//! A rank program for chorus's multi-process tests: started by `chorus-run`,
//! it runs one scenario and reports on stdout. Not an example to copy.
//!
//! Scenarios (first argument):
//! * `matrix`: every op × dtype against the serial reference, and a large
//!   f32 all_reduce for every reduce op.
//! * `kill`: rank `FAULT_RANK` SIGKILLs itself in the middle of a large
//!   all_reduce; survivors report how their pending work failed.
//! * `board-kill`: rank `FAULT_RANK` SIGKILLs itself between two small
//!   all_reduces of a group large enough to run them on its shared-memory
//!   board; survivors report how the second failed.
//! * `stop`: rank `FAULT_RANK` SIGSTOPs itself; survivors time out and dump
//!   their flight recorders.
//! * `mismatch`: rank `FAULT_RANK` calls all_gather where the others call
//!   all_reduce.
//! * `store-dies`: rank 0 SIGKILLs itself; the others then use the store
//!   (a new group of ranks 1 and 2, and an all_reduce on it) and report
//!   `kind=none` if it still serves, `kind=Store` with the error if not.
//! * `propagate`: like `stop`, with error propagation on and the group's
//!   timeout at `FAULT_LONG_TIMEOUT_MS` (default 30 s); only rank 0 runs the
//!   last op under `FAULT_TIMEOUT_MS`, so it detects the stopped rank and
//!   publishes the failure, and the others fail with `Remote` long before
//!   their own timeout.
//!
//! * `restart` (under torchrun with `--max-restarts`): every rank joins and
//!   runs an all_reduce; in the first attempt
//!   (`TORCHELASTIC_RESTART_COUNT=0`) rank `FAULT_RANK` then exits with 1,
//!   so torchrun restarts the workers, which must join afresh and agree.
//!   Prints `OK rank=R attempt=A sum=S`.
//!
//! * `hosts`: every op × f32, f64, bf16, i8 × 0, 1, 4099 elements and
//!   16 MiB against the serial reference (the cross-host matrix).
//! * `loop`: 16 MiB all_reduces (op timeout 300 s) for `LOOP_SECS`
//!   (default 120), printing `LOOP rank=R iter=I` now and then; the first
//!   failure is reported with `at_ms` (milliseconds since the Unix epoch)
//!   and the rank exits 1 (for partition and launcher-loss tests).
//!
//! * `reform-kill` / `reform-stop`: rank `FAULT_RANK` SIGKILLs itself
//!   mid all_reduce, or SIGSTOPs itself before one; the survivors see the
//!   op fail, re-form the group (`FAULT_WINDOW_MS`, default 1000) and check
//!   an all_reduce on it against the serial reference, reporting
//!   `kind=Reformed` with `msg=epoch=E size=N rank=R` (`elapsed_ms` from
//!   the failure to the checked op). A stopped rank, continued, finds its
//!   old group gone, re-forms and reports `kind=VotedOut`.
//! * `loop-reform`: like `loop`, but the first failure is followed by
//!   `reform` (window `REFORM_WINDOW_MS`, default 2000); the new group runs
//!   three all_reduces against the serial reference and the rank prints
//!   `REFORMED rank=R new_rank=N size=S epoch=E members=[..]` and exits 0,
//!   or `RESULT rank=R kind=Reform msg=...` and exits 1 if it cannot.
//!
//! * `grow`: killed ranks come back under `chorus-run --max-restarts` and
//!   rejoin (see `grow.rs`).
//!
//! Survivors print `RESULT rank=R kind=KIND elapsed_ms=MS msg=...` and exit
//! 0; a survivor whose op did not fail exits 3.
#![forbid(unsafe_code)]

mod grow;

use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

use chorus::{Failed, ProcessGroup, ReduceOp};
use half::bf16;
use tests_integration::testkit::{
    check_all_dtypes, check_all_ops, check_large_all_reduce, data, reference, LARGE, SIZES,
};

fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn report(rank: usize, start: Instant, kind: &str, msg: &str) {
    println!(
        "RESULT rank={rank} kind={kind} elapsed_ms={} msg={}",
        start.elapsed().as_millis(),
        msg.replace('\n', " ")
    );
}

/// Reports an op's outcome; the exit code: 3 if it succeeded (the
/// scenarios expect a failure), 0 if it failed.
fn outcome<T>(rank: usize, start: Instant, r: Result<T, chorus::WorkError>) -> i32 {
    match r {
        Ok(_) => {
            report(rank, start, "none", "the op succeeded");
            3
        }
        Err(e) => {
            report(rank, start, e.kind(), &e.to_string());
            0
        }
    }
}

fn signal_self(sig: Signal) {
    let _ = nix::sys::signal::raise(sig);
}

/// Two all_reduces, then the victim stops itself (SIGSTOP); the others run
/// a third on `op_pg` and report how it ended.
async fn stop_scenario(
    pg: &ProcessGroup,
    op_pg: ProcessGroup,
    rank: usize,
    victim: usize,
) -> Result<i32, chorus::Error> {
    pg.all_reduce(vec![1.0f32; 10], ReduceOp::Sum)?.await?;
    pg.all_reduce(vec![1.0f32; 10], ReduceOp::Sum)?.await?;
    if rank == victim {
        println!(
            "VICTIM rank={rank} pid={} stopping itself",
            std::process::id()
        );
        signal_self(Signal::SIGSTOP);
    }
    let start = Instant::now();
    let r = op_pg
        .all_reduce(vec![1.0f32; 10], ReduceOp::Sum)?
        .await
        .map_err(Failed::into_error);
    Ok(outcome(rank, start, r))
}

/// `reform-kill` and `reform-stop` (see the module docs).
async fn reform_scenario(
    pg: &ProcessGroup,
    rank: usize,
    victim: usize,
    kill: bool,
) -> Result<i32, chorus::Error> {
    let window = Duration::from_millis(env_num("FAULT_WINDOW_MS", 1000));
    pg.all_reduce(vec![1.0f32; 1000], ReduceOp::Sum)?.await?;
    if rank == victim && !kill {
        println!(
            "VICTIM rank={rank} pid={} stopping itself",
            std::process::id()
        );
        signal_self(Signal::SIGSTOP);
    }
    let w = pg.all_reduce(vec![1.0f32; 4 << 20], ReduceOp::Sum)?;
    if rank == victim && kill {
        std::thread::sleep(Duration::from_millis(2));
        println!(
            "VICTIM rank={rank} pid={} killing itself",
            std::process::id()
        );
        signal_self(Signal::SIGKILL);
    }
    let failed = match w.await {
        Ok(_) if rank != victim => {
            report(rank, Instant::now(), "none", "the op succeeded");
            return Ok(3);
        }
        Ok(_) => None,
        Err(f) => Some(f),
    };
    let start = Instant::now();
    if let Some(f) = &failed {
        println!("FAILED rank={rank} kind={}", f.error().kind());
    }
    let new = match pg.reform(window).await {
        Ok(g) => g,
        Err(chorus::ReformError::VotedOut { epoch, members, .. }) => {
            let msg = format!("epoch={epoch} members={members:?}");
            report(rank, start, "VotedOut", &msg);
            return Ok(0);
        }
        Err(e) => {
            report(rank, start, "ReformFailed", &e.to_string());
            return Ok(1);
        }
    };
    let (r, n) = (new.rank(), new.size());
    let case = 7 + new.epoch();
    let got = new
        .all_reduce(data::<f32>(case, r, 4099, ReduceOp::Sum), ReduceOp::Sum)?
        .await?;
    if got != reference::<f32>(case, n, 4099, ReduceOp::Sum) {
        report(
            rank,
            start,
            "Wrong",
            "the re-formed group's all_reduce differs from the reference",
        );
        return Ok(1);
    }
    let msg = format!("epoch={} size={n} rank={r}", new.epoch());
    report(rank, start, "Reformed", &msg);
    new.barrier()?.await?;
    new.shutdown().await?;
    Ok(0)
}

async fn main_async(scenario: &str) -> Result<i32, chorus::Error> {
    let timeout = Duration::from_millis(env_num("FAULT_TIMEOUT_MS", 1000));
    let victim = env_num("FAULT_RANK", 1) as usize;
    let propagate = scenario == "propagate";
    let group_timeout = if propagate {
        Duration::from_millis(env_num("FAULT_LONG_TIMEOUT_MS", 30_000))
    } else {
        timeout
    };
    let mut builder = ProcessGroup::builder().timeout(group_timeout);
    if propagate {
        builder = builder.propagate_errors(true);
    }
    // Elsewhere CHORUS_PROPAGATE_ERRORS decides.
    let pg = builder.init_from_env().await?;
    let rank = pg.rank();
    println!("PID rank={rank} pid={}", std::process::id());
    match scenario {
        "matrix" => {
            let pg = pg.with_timeout(Duration::from_secs(60));
            let checks = match check_all_dtypes(&pg, &SIZES).await {
                Ok(n) => check_large_all_reduce(&pg, LARGE).await.map(|m| n + m),
                Err(e) => Err(e),
            };
            match checks {
                Ok(n) => {
                    pg.shutdown().await?;
                    println!("OK rank={rank} checks={n}");
                    Ok(0)
                }
                Err(e) => {
                    println!("FAIL rank={rank} {e}");
                    Ok(1)
                }
            }
        }
        "kill" => {
            pg.all_reduce(vec![1.0f32; 1000], ReduceOp::Sum)?.await?;
            let big = vec![1.0f32; 16 << 20];
            let start = Instant::now();
            let w = pg.all_reduce(big, ReduceOp::Sum)?;
            if rank == victim {
                std::thread::sleep(Duration::from_millis(2));
                println!(
                    "VICTIM rank={rank} pid={} killing itself",
                    std::process::id()
                );
                signal_self(Signal::SIGKILL);
            }
            Ok(outcome(rank, start, w.await.map_err(Failed::into_error)))
        }
        "board-kill" => {
            // More than 8 ranks on one host: the small ops run on the
            // group's shared-memory board, and no connection is made.
            pg.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?.await?;
            if rank == victim {
                println!(
                    "VICTIM rank={rank} pid={} killing itself",
                    std::process::id()
                );
                signal_self(Signal::SIGKILL);
            }
            let start = Instant::now();
            let w = pg.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?;
            Ok(outcome(rank, start, w.await.map_err(Failed::into_error)))
        }
        "stop" => stop_scenario(&pg, pg.clone(), rank, victim).await,
        "reform-kill" => reform_scenario(&pg, rank, victim, true).await,
        "reform-stop" => reform_scenario(&pg, rank, victim, false).await,
        "grow" => grow::grow_scenario(pg, env_num("WORLD_SIZE", 1) as usize).await,
        "propagate" => {
            // Rank 0 alone gives up soon; the others would wait the long
            // group timeout but for rank 0's published failure.
            let op_pg = if rank == 0 {
                pg.with_timeout(timeout)
            } else {
                pg.clone()
            };
            stop_scenario(&pg, op_pg, rank, victim).await
        }
        "mismatch" => {
            let start = Instant::now();
            let r = if rank == victim {
                pg.all_gather(vec![1.0f32; 10], vec![0.0; 10 * pg.size()])?
                    .await
                    .map(|_| ())
                    .map_err(Failed::into_error)
            } else {
                pg.all_reduce(vec![1.0f32; 12], ReduceOp::Sum)?
                    .await
                    .map(|_| ())
                    .map_err(Failed::into_error)
            };
            Ok(outcome(rank, start, r))
        }
        "store-dies" => {
            pg.barrier()?.await?;
            if rank == 0 {
                // Let every rank leave the barrier first: a killed process's
                // socket may reset data still in flight to the others.
                std::thread::sleep(Duration::from_millis(200));
                println!("VICTIM rank=0 pid={} killing itself", std::process::id());
                signal_self(Signal::SIGKILL);
            }
            // Give the store host time to die, then use the store.
            tokio::time::sleep(Duration::from_millis(600)).await;
            // Whether that takes the store down depends on who serves it:
            // rank 0 (`chorus-run --rank0-store`), or chorus-run itself.
            let start = Instant::now();
            match pg.new_group(&[1, 2]).await {
                Ok(Some(g)) => {
                    let sum = g.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?.await?;
                    report(
                        rank,
                        start,
                        "none",
                        &format!("new_group succeeded, sum {}", sum[0]),
                    );
                    Ok(0)
                }
                Ok(None) => {
                    report(rank, start, "none", "not a member of the new group");
                    Ok(0)
                }
                Err(chorus::Error::Store(e)) => {
                    report(rank, start, "Store", &e.to_string());
                    Ok(0)
                }
                Err(e) => {
                    report(rank, start, "Other", &e.to_string());
                    Ok(0)
                }
            }
        }
        "hosts" => {
            let pg = pg.with_timeout(Duration::from_secs(120));
            let big = |bytes: usize| (16usize << 20) / bytes;
            let mut checks = 0;
            let r = async {
                checks += check_all_ops::<f32>(&pg, 1, &[0, 1, 4099, big(4)]).await?;
                checks += check_all_ops::<f64>(&pg, 2, &[0, 1, 4099, big(8)]).await?;
                checks += check_all_ops::<bf16>(&pg, 4, &[0, 1, 4099, big(2)]).await?;
                checks += check_all_ops::<i8>(&pg, 5, &[0, 1, 4099, big(1)]).await?;
                Ok::<_, String>(())
            }
            .await;
            match r {
                Ok(()) => {
                    pg.shutdown().await?;
                    println!("OK rank={rank} checks={checks}");
                    Ok(0)
                }
                Err(e) => {
                    println!("FAIL rank={rank} {e}");
                    Ok(1)
                }
            }
        }
        "loop-reform" => {
            let pg = pg.with_timeout(Duration::from_secs(300));
            let mut buf = vec![1.0f32; 4 << 20];
            let mut iter = 0u64;
            let failure = loop {
                match pg.all_reduce(buf, ReduceOp::Avg)?.await {
                    Ok(b) => buf = b,
                    Err(f) => break f.into_error(),
                }
                iter += 1;
                if iter % 4 == 1 {
                    println!("LOOP rank={rank} iter={iter}");
                }
            };
            println!(
                "RESULT rank={rank} kind={} iter={iter} msg={}",
                failure.kind(),
                failure.to_string().replace('\n', " ")
            );
            let window = Duration::from_millis(env_num("REFORM_WINDOW_MS", 2000));
            let new = match pg.reform(window).await {
                Ok(g) => g,
                Err(e) => {
                    println!(
                        "RESULT rank={rank} kind=Reform msg={}",
                        e.to_string().replace('\n', " ")
                    );
                    return Ok(1);
                }
            };
            let members = new.members().to_vec();
            for k in 0..3u32 {
                let mine = vec![(rank + 1) as f32 * (k + 1) as f32; 4099];
                let got = new
                    .all_reduce(mine, ReduceOp::Sum)?
                    .await
                    .map_err(Failed::into_error)?;
                let want: f32 = members
                    .iter()
                    .map(|&r| (r + 1) as f32 * (k + 1) as f32)
                    .sum();
                if got.iter().any(|&v| v != want) {
                    println!("FAIL rank={rank} after reform: got {} want {want}", got[0]);
                    return Ok(1);
                }
            }
            println!(
                "REFORMED rank={rank} new_rank={} size={} epoch={} members={members:?}",
                new.rank(),
                new.size(),
                new.epoch()
            );
            Ok(0)
        }
        "loop" => {
            let pg = pg.with_timeout(Duration::from_secs(300));
            let secs = Duration::from_secs(env_num("LOOP_SECS", 120));
            let start = Instant::now();
            let mut buf = vec![1.0f32; 4 << 20];
            let mut iter = 0u64;
            loop {
                let r = match pg.all_reduce(buf, ReduceOp::Avg) {
                    Ok(w) => w.await.map_err(Failed::into_error),
                    Err(rej) => Err(rej.error),
                };
                match r {
                    Ok(b) => buf = b,
                    Err(e) => {
                        let at_ms = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis());
                        println!(
                            "RESULT rank={rank} kind={} at_ms={at_ms} iter={iter} msg={}",
                            e.kind(),
                            e.to_string().replace('\n', " ")
                        );
                        return Ok(1);
                    }
                }
                iter += 1;
                if iter % 4 == 1 {
                    println!("LOOP rank={rank} iter={iter}");
                }
                if start.elapsed() > secs {
                    pg.shutdown().await?;
                    println!("OK rank={rank} iters={iter}");
                    return Ok(0);
                }
            }
        }
        "restart" => {
            let attempt = env_num("TORCHELASTIC_RESTART_COUNT", 0);
            let pg = pg.with_timeout(Duration::from_secs(30));
            let sum = pg
                .all_reduce(vec![(rank + 1) as f32; 4], ReduceOp::Sum)?
                .await?;
            if attempt == 0 && rank == victim {
                println!("VICTIM rank={rank} attempt=0 exiting with 1");
                std::process::exit(1);
            }
            // The first attempt's survivors wait here for torchrun to stop them.
            pg.barrier()?.await?;
            pg.shutdown().await?;
            println!("OK rank={rank} attempt={attempt} sum={}", sum[0]);
            Ok(0)
        }
        other => {
            eprintln!(
                "unknown scenario '{other}' (matrix, hosts, loop, kill, board-kill, stop, propagate, mismatch, store-dies, restart, reform-kill, reform-stop, grow)"
            );
            Ok(2)
        }
    }
}

fn main() -> std::process::ExitCode {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(main_async(&scenario)) {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            println!(
                "ERROR rank={} {e}",
                std::env::var("RANK").unwrap_or_default()
            );
            std::process::ExitCode::from(4)
        }
    }
}
