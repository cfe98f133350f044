//! A rank program for chorus's multi-GPU checks of the NCCL backend: started
//! by `chorus-run`, one process per GPU (device = `LOCAL_RANK`), or several
//! on one GPU (`chorus-run --share-gpu`), it runs one scenario and reports
//! on stdout. Not an example to copy.
//!
//! Scenarios (first argument):
//! * `matrix`: every op (all_reduce / reduce / reduce_scatter × sum prod min
//!   max avg, broadcast, all_gather, all_to_all, send/recv both ways,
//!   send_recv) × dtype (f32 f64 f16 bf16 i8 u8 i32 i64) on device buffers
//!   with random data and poisoned outputs, checked against the serial
//!   reference; then subgroups made by `new_group` (a split of the world
//!   communicator) doing an all_reduce. Prints `OK rank=R checks=N` or one
//!   `MISMATCH` line per failed check and `FAIL rank=R ...`.
//! * `groups`: a group of mixed collectives and a ring of send/recv (the
//!   recv staged first) on device buffers, checked against the reference;
//!   a CUDA graph capturing a group of 4 all_reduces and a send/recv ring,
//!   replayed 5 times with fresh inputs and checked after each replay; and
//!   16 × 1 MiB all_reduces issued one by one and as a group (median host
//!   submit and total µs over `GROUPS_ITERS` rounds, default 120). Prints
//!   `OK rank=R checks=N` or `FAIL ...`.
//! * `seed`: three groups of the same ranks, each running a collective and
//!   send/recv over every pair, twice: communicator creations counted
//!   against the design's (one per group for collectives, one per pair,
//!   none on later ops). Prints `SEED` lines, then `OK` or `FAIL`.
//! * `levels`: the three completion levels across ranks whose inputs are
//!   ready at different times (enqueued, stream-ordered, GPU-finished).
//! * `checked` (with `CHORUS_CHECK_OPS=1`): device collectives called
//!   differently (roots, counts, a group's size) are refused on every rank
//!   with `Mismatch` before NCCL sees them; the group stays usable.
//! * `kill` / `stop`: rank `FAULT_RANK` (default 1) SIGKILLs / SIGSTOPs
//!   itself mid all_reduce; the survivors must fail within the peer
//!   liveness timeout (`CHORUS_PEER_LIVENESS_MS`) and a second with
//!   `PeerLost` / `PeerSilent` naming it, re-form without it
//!   (`FAULT_WINDOW_MS`, default 2000) and pass checked ops on the new
//!   group. Prints `RESULT` and `REFORM` lines (how the new communicator
//!   came: `shrunk` or `fresh`). Run under `chorus-run --keep-going`.
//! * `rejoin`: under `chorus-run --max-restarts 1`, training steps with
//!   rank `FAULT_RANK` killed in one; the replacement rejoins, and the
//!   parameters end bit-identical on every rank and equal to the serial
//!   reference of the steps.
//! * `busbw`: all_reduce f32 from 8 B to 1 GiB; prints one JSON line per size
//!   (`bytes`, `median_us` of submit-to-await round trips, `submit_us` the
//!   median host time of the `all_reduce` call alone, `in_progress` how many
//!   of the timed calls returned `ncclInProgress`, `loop_us` per op of 20
//!   back-to-back ops, `busbw_gbps` from each).
//!
//! Files: `support` (what every scenario uses), `checker` (counting checks
//! and reporting them), and one file per scenario: `matrix`, `groups`,
//! `seed`, `levels`, `checked`, `faults` (`kill`, `stop`, `rejoin`),
//! `busbw`.
#![forbid(unsafe_code)]

mod busbw;
mod checked;
mod checker;
mod faults;
mod groups;
mod levels;
mod matrix;
mod seed;
mod support;

use std::time::{Duration, Instant};

use chorus::{Device, ProcessGroup, StreamPriority};

use checker::report;
use support::env_num;

async fn main_async(scenario: &str) -> Result<i32, String> {
    let local: usize = env_num("LOCAL_RANK", 0) as usize;
    let dev = Device::get(local).map_err(|e| format!("device {local}: {e}"))?;
    let s = dev
        .new_stream(StreamPriority::Normal)
        .map_err(|e| format!("stream: {e}"))?;
    let t = Instant::now();
    let pg = ProcessGroup::builder()
        .timeout(Duration::from_secs(60))
        .device(local)
        .init_from_env()
        .await
        .map_err(|e| format!("group: {e}"))?;
    let rank = pg.rank();
    if rank == 0 {
        match nccl_sys::nccl() {
            Ok(n) => println!(
                "NCCL version={} path={} missing_optional={:?}",
                n.version(),
                n.path(),
                n.missing_optional()
            ),
            Err(e) => println!("NCCL unavailable: {e}"),
        }
    }
    println!(
        "START rank={rank} size={} device={local} pid={} init_ms={}",
        pg.size(),
        std::process::id(),
        t.elapsed().as_millis()
    );
    let code = match scenario {
        "seed" => report(rank, seed::seed(&pg, &s).await, ""),
        "levels" => report(rank, levels::levels(&pg, &s, &dev).await, ""),
        "checked" => report(rank, checked::checked(&pg, &s).await, ""),
        "kill" | "stop" | "rejoin" => {
            let run = match scenario {
                "kill" => faults::kill(&pg, &s).await,
                "stop" => faults::stop(&pg, &s).await,
                _ => faults::rejoin(pg.clone(), &s).await,
            };
            let (outcome, last) = match run {
                Ok((ck, last)) => (Ok(ck), last),
                Err(e) => (Err(e), None),
            };
            let code = report(rank, outcome, "");
            // The failed group is left as it is (its communicators are
            // aborted); the last group says goodbye.
            if let Some(last) = last {
                let t = Instant::now();
                last.shutdown()
                    .await
                    .map_err(|e| format!("shutdown: {e}"))?;
                println!("SHUTDOWN rank={rank} ms={}", t.elapsed().as_millis());
            }
            return Ok(code);
        }
        "matrix" => report(
            rank,
            matrix::matrix(&pg, &s).await,
            &format!(" comms={}", pg.nccl_comms_created()),
        ),
        "groups" => report(rank, groups::groups(&pg, &s).await, ""),
        "busbw" => match busbw::busbw(&pg, &s).await {
            Ok(()) => 0,
            Err(e) => {
                println!("FAIL rank={rank} {e}");
                1
            }
        },
        other => {
            eprintln!(
                "unknown scenario '{other}' (matrix, seed, levels, checked, groups, busbw, kill, stop, rejoin)"
            );
            2
        }
    };
    let t = Instant::now();
    pg.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    println!("SHUTDOWN rank={rank} ms={}", t.elapsed().as_millis());
    Ok(code)
}

fn main() -> std::process::ExitCode {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let code = match rt.block_on(main_async(&scenario)) {
        Ok(code) => code,
        Err(e) => {
            println!(
                "ERROR rank={} {e}",
                std::env::var("RANK").unwrap_or_default()
            );
            4
        }
    };
    // Exit without running the runtime's or the communicators' destructors
    // a second time in a failed job.
    std::process::ExitCode::from(code as u8)
}
