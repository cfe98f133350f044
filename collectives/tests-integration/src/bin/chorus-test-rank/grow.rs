//! The `grow` scenario: ranks `FAULT_RANKS` (comma-separated) SIGKILL
//! themselves mid all_reduce of `FAULT_ELEMS` f32s; under `chorus-run
//! --max-restarts` each comes back as a replacement rank and rejoins.
//!
//! Every member of every group it forms (survivors and replacements alike)
//! calls `admit` first (a group with replacements runs nothing before; its
//! first `admit` returns it), then runs the same steps: broadcast the
//! parameters from rank 0 (the lowest survivor), check an all_reduce
//! against the serial reference, and, while the group is smaller than the
//! world, `admit` joiners (up to `FAULT_ADMITS` tries, default 200, 10 ms
//! apart). Each reports
//! `RESULT rank=W kind=Grown elapsed_ms=MS msg=epoch=E size=N rank=R
//! params=HASH` (W: world rank; MS: from the failure to the full group on a
//! survivor, from the start on a replacement), or `kind=Shrunk` if the
//! world did not come back. Victims print `VICTIM ... at_ms=T` before they
//! die; replacements print `FIRST_OP rank=W at_ms=T` once their first op
//! (the broadcast) is done (milliseconds since the Unix epoch).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chorus::{Failed, ProcessGroup, ReduceOp};
use nix::sys::signal::Signal;
use tests_integration::testkit::{data, reference};

use crate::{env_num, report, signal_self};

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The parameters every survivor holds (a replacement starts from zeros).
fn params() -> Vec<f32> {
    (0..4099u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0)
        .collect()
}

fn hash(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
    })
}

/// The steps every member of a new group runs (see the module docs).
async fn sync(pg: &ProcessGroup, p: Vec<f32>) -> Result<Result<Vec<f32>, String>, chorus::Error> {
    let p = pg.broadcast(p, 0)?.await?;
    let (r, n) = (pg.rank(), pg.size());
    let case = 11 + pg.epoch();
    let got = pg
        .all_reduce(data::<f32>(case, r, 4099, ReduceOp::Sum), ReduceOp::Sum)?
        .await?;
    if got != reference::<f32>(case, n, 4099, ReduceOp::Sum) {
        return Ok(Err(format!(
            "epoch {}: the all_reduce differs from the reference",
            pg.epoch()
        )));
    }
    Ok(Ok(p))
}

pub(crate) async fn grow_scenario(pg: ProcessGroup, world: usize) -> Result<i32, chorus::Error> {
    let window = Duration::from_millis(env_num("FAULT_WINDOW_MS", 1000));
    let me = pg.members()[pg.rank()];
    let restarted = env_num("CHORUS_RANK_RESTARTS", 0) > 0;
    let start = Instant::now();
    let mut pg = pg;
    let mut p;
    if restarted {
        // Its first admit returns its group, as the survivors' returned it
        // to them.
        if let Some(g) = pg.admit(window).await? {
            pg = g;
        }
        p = match sync(&pg, vec![0.0; 4099]).await? {
            Ok(p) => p,
            Err(msg) => {
                report(me, start, "Wrong", &msg);
                return Ok(1);
            }
        };
        println!("FIRST_OP rank={me} at_ms={}", unix_ms());
    } else {
        let victims: Vec<usize> = std::env::var("FAULT_RANKS")
            .unwrap_or_else(|_| "1".into())
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        let elems = env_num("FAULT_ELEMS", 1) as usize;
        p = params();
        pg.all_reduce(vec![1.0f32; 16], ReduceOp::Sum)?.await?;
        let w = pg.all_reduce(vec![1.0f32; elems], ReduceOp::Sum)?;
        if victims.contains(&me) {
            println!(
                "VICTIM rank={me} pid={} at_ms={} killing itself",
                std::process::id(),
                unix_ms()
            );
            signal_self(Signal::SIGKILL);
        }
        if w.await.map_err(Failed::into_error).is_ok() {
            // A 4-byte all_reduce may finish before the victim dies: the
            // next op fails instead.
            let again = pg.all_reduce(vec![1.0f32; elems], ReduceOp::Sum)?.await;
            if again.is_ok() {
                report(me, start, "none", "no op failed");
                return Ok(3);
            }
        }
        let failed = Instant::now();
        pg = match pg.reform(window).await {
            Ok(g) => g,
            Err(e) => {
                report(me, failed, "ReformFailed", &e.to_string());
                return Ok(1);
            }
        };
        println!(
            "REFORMED rank={me} elapsed_ms={} size={}",
            failed.elapsed().as_millis(),
            pg.size()
        );
        if let Some(g) = pg.admit(window).await? {
            pg = g;
        }
        p = match sync(&pg, p).await? {
            Ok(p) => p,
            Err(msg) => {
                report(me, failed, "Wrong", &msg);
                return Ok(1);
            }
        };
    }
    let tries = env_num("FAULT_ADMITS", 200);
    let mut tried = 0;
    while pg.size() < world && tried < tries {
        tried += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        match pg.admit(window).await {
            Ok(None) => {}
            Ok(Some(grown)) => {
                pg = grown;
                p = match sync(&pg, p).await? {
                    Ok(p) => p,
                    Err(msg) => {
                        report(me, start, "Wrong", &msg);
                        return Ok(1);
                    }
                };
            }
            Err(e) => {
                report(me, start, "AdmitFailed", &e.to_string());
                return Ok(1);
            }
        }
    }
    let kind = if pg.size() == world {
        "Grown"
    } else {
        "Shrunk"
    };
    let msg = format!(
        "epoch={} size={} rank={} params={:016x}",
        pg.epoch(),
        pg.size(),
        pg.rank(),
        hash(&p)
    );
    report(me, start, kind, &msg);
    pg.barrier()?.await?;
    pg.shutdown().await?;
    Ok(0)
}
