//! The fault scenarios: a rank dies (`kill`), hangs (`stop`), or dies and
//! is replaced (`rejoin`, under `chorus-run --max-restarts 1`); the
//! survivors must fail within the peer liveness timeout and a second,
//! naming the rank, re-form, and go on with correct results.
//!
//! Run them under `chorus-run --keep-going` (`kill`, `stop`) with
//! `CHORUS_PEER_LIVENESS_MS` set; `FAULT_RANK` (default 1) is the rank
//! that fails, `FAULT_WINDOW_MS` (default 2000) the re-form window.

use std::time::{Duration, Instant};

use chorus::test_util::reference_reduce;
use chorus::{ProcessGroup, ReduceOp, Stream, WorkError};
use nix::sys::signal::{raise, Signal};
use tests_integration::testkit::{data, poison, reduce_tolerance, reference};

use super::checker::Checker;
use super::support::{down, env_num, rej, up, werr, Res};

/// The group's peer liveness timeout, as the group reads it.
fn liveness() -> Duration {
    Duration::from_millis(env_num("CHORUS_PEER_LIVENESS_MS", 10_000))
}

fn window() -> Duration {
    Duration::from_millis(env_num("FAULT_WINDOW_MS", 2_000))
}

/// How a survivor saw the failure: the first error of its ops, when.
struct Seen {
    error: WorkError,
    after: Duration,
}

/// Every rank submits large all_reduces; the victim submits one, lets it
/// start and then `fail`s (SIGKILL or SIGSTOP). Returns, on a survivor, the
/// first error and how long after the start it came.
async fn fail_mid_op(pg: &ProcessGroup, s: &Stream, victim: usize, fail: Signal) -> Res<Seen> {
    let rank = pg.rank();
    let pg = pg.with_timeout(Duration::from_secs(120));
    pg.all_reduce(up(s, &[1.0f32; 1024])?, ReduceOp::Sum)
        .map_err(rej("warm-up"))?
        .await
        .map_err(werr("warm-up"))?;
    // 64 MiB of f32 per op by default (`FAULT_ELEMS`).
    let n = env_num("FAULT_ELEMS", 16 << 20) as usize;
    let bufs: Vec<_> = (0..4)
        .map(|_| up(s, &vec![1.0f32; n]))
        .collect::<Res<_>>()?;
    s.synchronize().map_err(|e| format!("sync: {e}"))?;
    pg.barrier()
        .map_err(rej("barrier"))?
        .await
        .map_err(werr("barrier"))?;
    let start = Instant::now();
    let mut works = Vec::new();
    for b in bufs {
        works.push(
            pg.all_reduce(b, ReduceOp::Sum)
                .map_err(rej("large all_reduce"))?,
        );
        if rank == victim {
            std::thread::sleep(Duration::from_millis(1));
            println!(
                "VICTIM rank={rank} pid={} {fail} after {:?}",
                std::process::id(),
                start.elapsed()
            );
            raise(fail).map_err(|e| format!("raise {fail}: {e}"))?;
        }
    }
    for w in works {
        if let Err(f) = w.await {
            return Ok(Seen {
                error: f.error().clone(),
                after: start.elapsed(),
            });
        }
    }
    Err("every large all_reduce succeeded although a rank failed".into())
}

/// Checks that the failure came in time and named the victim (as
/// `kind`), then re-forms and checks the new group's ops. Returns the new
/// group.
async fn survive(
    pg: &ProcessGroup,
    s: &Stream,
    seen: Seen,
    victim: usize,
    kind: &str,
    ck: &mut Checker,
) -> Res<ProcessGroup> {
    let rank = pg.rank();
    let (error, after) = (seen.error, seen.after);
    let peer = match &error {
        WorkError::PeerLost { peer, .. } | WorkError::PeerSilent { peer, .. } => Some(*peer),
        _ => None,
    };
    let bound = liveness() + Duration::from_secs(1);
    println!(
        "RESULT rank={rank} kind={} peer={} elapsed_ms={} bound_ms={} msg={}",
        error.kind(),
        peer.map_or("none".into(), |p| p.to_string()),
        after.as_millis(),
        bound.as_millis(),
        error.to_string().replace('\n', " ")
    );
    ck.count(
        format!("failed as {kind} naming rank {victim}"),
        error.kind() == kind && peer == Some(victim),
        format!("{} (peer {peer:?})", error.kind()),
    );
    ck.count(
        "failed within the liveness timeout and a second".into(),
        after <= bound,
        format!("after {after:?}, bound {bound:?}"),
    );
    let t = Instant::now();
    let new = pg
        .reform(window())
        .await
        .map_err(|e| format!("reform: {e}"))?;
    let reform_ms = t.elapsed().as_secs_f64() * 1e3;
    let shrunk = new.nccl_shrunk();
    let t = Instant::now();
    ops_after(&new, s, 1, ck).await?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "REFORM rank={rank} new_rank={} size={} epoch={} members={:?} reform_ms={reform_ms:.1} comm={} shrink_ms={} first_op_ms={first_ms:.1} comms_created={}",
        new.rank(),
        new.size(),
        new.epoch(),
        new.members(),
        if shrunk.is_some() { "shrunk" } else { "fresh" },
        shrunk.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3)),
        new.nccl_comms_created()
    );
    ck.count(
        "the new group has every rank but the victim".into(),
        new.size() + 1 == pg.size() && !new.members().contains(&pg.members()[victim]),
        format!("members {:?}", new.members()),
    );
    for round in 2..4 {
        ops_after(&new, s, round, ck).await?;
    }
    Ok(new)
}

/// Ops on a re-formed group, checked against the reference over its
/// ranks: all_reduce, broadcast, all_gather and a send/recv ring.
async fn ops_after(g: &ProcessGroup, s: &Stream, round: u64, ck: &mut Checker) -> Res<()> {
    let (rank, n) = (g.rank(), g.size());
    let c = 31_000 + 100 * round + 10 * g.epoch();
    let w = format!("epoch {} round {round} all_reduce", g.epoch());
    let b = g
        .all_reduce(
            up(s, &data::<f32>(c, rank, 4099, ReduceOp::Sum))?,
            ReduceOp::Sum,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(w, &down(&b)?, &reference::<f32>(c, n, 4099, ReduceOp::Sum));
    let root = (round as usize) % n;
    let w = format!("epoch {} round {round} broadcast from {root}", g.epoch());
    let mine = if rank == root {
        data::<f32>(c + 1, root, 777, ReduceOp::Sum)
    } else {
        poison(777)
    };
    let b = g
        .broadcast(up(s, &mine)?, root)
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(w, &down(&b)?, &data::<f32>(c + 1, root, 777, ReduceOp::Sum));
    let w = format!("epoch {} round {round} all_gather", g.epoch());
    let (_, o) = g
        .all_gather(
            up(s, &data::<f32>(c + 2, rank, 13, ReduceOp::Sum))?,
            up(s, &poison::<f32>(13 * n))?,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    let want: Vec<f32> = (0..n)
        .flat_map(|r| data::<f32>(c + 2, r, 13, ReduceOp::Sum))
        .collect();
    ck.check(w, &down(&o)?, &want);
    if n > 1 {
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let w = format!("epoch {} round {round} ring from {prev}", g.epoch());
        let (rbuf, sbuf) = (
            up(s, &poison::<f32>(129))?,
            up(s, &data::<f32>(c + 3, rank, 129, ReduceOp::Sum))?,
        );
        let (rx, tx) = g
            .batched(|gr| Ok::<_, chorus::Error>((gr.recv(rbuf, prev)?, gr.send(sbuf, next)?)))
            .map_err(|e| format!("{w}: {e}"))?;
        let got = rx.await.map_err(werr(&w))?;
        tx.await.map_err(werr(&w))?;
        ck.check(
            w,
            &down(&got)?,
            &data::<f32>(c + 3, prev, 129, ReduceOp::Sum),
        );
    }
    Ok(())
}

/// `kill`: the victim SIGKILLs itself mid all_reduce; the survivors fail
/// with `PeerLost` naming it, re-form without it and go on.
pub(super) async fn kill(pg: &ProcessGroup, s: &Stream) -> Res<(Checker, Option<ProcessGroup>)> {
    let victim = env_num("FAULT_RANK", 1) as usize;
    let mut ck = Checker::default();
    let seen = fail_mid_op(pg, s, victim, Signal::SIGKILL).await?;
    let new = survive(pg, s, seen, victim, "PeerLost", &mut ck).await?;
    Ok((ck, Some(new)))
}

/// `stop`: the victim SIGSTOPs itself mid all_reduce; the survivors fail
/// with `PeerSilent` naming it, re-form without it and go on; the new
/// group's rank 0 then SIGKILLs the stopped process so the job can end.
pub(super) async fn stop(pg: &ProcessGroup, s: &Stream) -> Res<(Checker, Option<ProcessGroup>)> {
    let victim = env_num("FAULT_RANK", 1) as usize;
    let mut ck = Checker::default();
    let pids = pg
        .all_gather(vec![std::process::id() as i64], vec![0i64; pg.size()])
        .map_err(rej("all_gather(pids)"))?
        .await
        .map_err(werr("all_gather(pids)"))?
        .1;
    let seen = fail_mid_op(pg, s, victim, Signal::SIGSTOP).await?;
    let new = survive(pg, s, seen, victim, "PeerSilent", &mut ck).await?;
    if new.rank() == 0 {
        let pid = nix::unistd::Pid::from_raw(pids[victim] as i32);
        nix::sys::signal::kill(pid, Signal::SIGKILL)
            .map_err(|e| format!("SIGKILL to the stopped rank (pid {pid}): {e}"))?;
        println!("STOPPED rank={victim} pid={pid} killed by the new group's rank 0");
    }
    Ok((ck, Some(new)))
}

/// What `rejoin` steps: a small model whose gradient each rank takes from
/// its world rank's data.
const PARAMS: usize = 4099;
const STEPS: usize = 12;
const KILL_STEP: usize = 4;

fn grads(step: usize, world_rank: usize) -> Vec<f32> {
    data::<f32>(50_000 + step as u64, world_rank, PARAMS, ReduceOp::Sum)
}

fn update(params: &mut [f32], g: &[f32]) {
    for (p, g) in params.iter_mut().zip(g) {
        *p -= 0.5 * g;
    }
}

/// `rejoin` (under `chorus-run --max-restarts 1`): training steps of
/// `all_reduce(Avg)` on the GPU; the victim SIGKILLs itself in step
/// [`KILL_STEP`] of its first start; the survivors re-form, the
/// replacement rejoins, and every group's members take rank 0's state
/// before their next step. At the end the parameters are bit-identical on
/// every rank and equal rank 0's serial reference of the steps it saw.
pub(super) async fn rejoin(pg: ProcessGroup, s: &Stream) -> Res<(Checker, Option<ProcessGroup>)> {
    let victim = env_num("FAULT_RANK", 1) as usize;
    let restarted = env_num("CHORUS_RANK_RESTARTS", 0) > 0;
    let me = pg.members()[pg.rank()];
    let mut ck = Checker::default();
    let mut pg = pg;
    let mut params: Vec<f32> = data::<f32>(49_999, 0, PARAMS, ReduceOp::Sum);
    let mut step = 0usize;
    // Rank 0's history: the members (world ranks) of every step it made.
    let mut history: Vec<Vec<usize>> = Vec::new();
    let mut synced: Option<u64> = None;
    let mut failures = 0;
    if restarted {
        println!(
            "REJOINED world_rank={me} rank={} size={} epoch={}",
            pg.rank(),
            pg.size(),
            pg.epoch()
        );
    }
    loop {
        // The step boundary, the same on every rank: a failed group is
        // re-formed, a waiting replacement let in, and a replacement's
        // first call returns the group it joined.
        if let Some(g) = pg
            .admit(window())
            .await
            .map_err(|e| format!("admit: {e}"))?
        {
            pg = g;
        }
        // A group this rank has not synced on yet: take rank 0's state.
        // The same ops on every member: the survivors of a re-form, the
        // members of a grown group and the replacement in it.
        if synced != Some(pg.epoch()) {
            match sync(&pg, s, &mut params, &mut step, &mut history).await {
                Ok(()) => synced = Some(pg.epoch()),
                Err(e) => {
                    println!("rank {me}: sync failed ({e}); the next admit re-forms");
                    continue;
                }
            }
        }
        if step >= STEPS {
            break;
        }
        let w = match pg.all_reduce(up(s, &grads(step, me))?, ReduceOp::Avg) {
            Ok(w) => w,
            Err(r) => {
                failures += 1;
                println!(
                    "rank {me}: step {step} refused ({}); the next admit re-forms",
                    r.error
                );
                continue;
            }
        };
        if me == victim && !restarted && step == KILL_STEP {
            std::thread::sleep(Duration::from_millis(1));
            println!("VICTIM world_rank={me} SIGKILL in step {step}");
            raise(Signal::SIGKILL).map_err(|e| format!("raise: {e}"))?;
        }
        match w.await {
            Ok(g) => {
                update(&mut params, &down(&g)?);
                history.push(pg.members().to_vec());
                step += 1;
            }
            Err(f) => {
                failures += 1;
                println!(
                    "rank {me}: step {step} failed ({}: {}); the next admit re-forms",
                    f.error().kind(),
                    f.error()
                );
            }
        }
    }
    // Every rank's parameters, bit for bit.
    let bits: Vec<i32> = params.iter().map(|p| p.to_bits() as i32).collect();
    let lo = pg
        .all_reduce(bits.clone(), ReduceOp::Min)
        .map_err(rej("all_reduce(min)"))?
        .await
        .map_err(werr("all_reduce(min)"))?;
    let hi = pg
        .all_reduce(bits, ReduceOp::Max)
        .map_err(rej("all_reduce(max)"))?
        .await
        .map_err(werr("all_reduce(max)"))?;
    let differing = lo.iter().zip(&hi).filter(|(a, b)| a != b).count();
    ck.count(
        format!("parameters bit-identical on all {} ranks", pg.size()),
        differing == 0,
        format!("{differing} of {PARAMS} parameters differ between ranks"),
    );
    if pg.rank() == 0 {
        let mut want = data::<f32>(49_999, 0, PARAMS, ReduceOp::Sum);
        for (k, members) in history.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = members.iter().map(|&w| grads(k, w)).collect();
            update(&mut want, &reference_reduce(ReduceOp::Avg, &inputs));
        }
        // Each step's mean may differ from the reference by a few roundings
        // (a group whose size is not a power of two), halved by the update;
        // the parameters' own roundings differ with it.
        let tol: f64 = history
            .iter()
            .map(|m| {
                let mean = reduce_tolerance::<f32>(ReduceOp::Avg, m.len());
                if mean == 0.0 {
                    0.0
                } else {
                    0.5 * mean + 128.0 * f64::from(f32::EPSILON)
                }
            })
            .sum();
        ck.check_within(
            "parameters against the serial reference of every step".into(),
            &params,
            &want,
            tol,
        );
        let sizes: Vec<usize> = history.iter().map(Vec::len).collect();
        println!(
            "REJOIN steps={} world_sizes={sizes:?} failures={failures} final_size={} epoch={}",
            history.len(),
            pg.size(),
            pg.epoch()
        );
    }
    Ok((ck, Some(pg)))
}

/// Rank 0's parameters (over NCCL), step and history length (over the
/// host) to every member of `pg`.
async fn sync(
    pg: &ProcessGroup,
    s: &Stream,
    params: &mut Vec<f32>,
    step: &mut usize,
    history: &mut Vec<Vec<usize>>,
) -> Res<()> {
    let b = pg
        .broadcast(up(s, params)?, 0)
        .map_err(rej("broadcast(params)"))?
        .await
        .map_err(werr("broadcast(params)"))?;
    let m = pg
        .broadcast(vec![*step as u64], 0)
        .map_err(rej("broadcast(step)"))?
        .await
        .map_err(werr("broadcast(step)"))?;
    *params = down(&b)?;
    *step = m[0] as usize;
    // Rank 0 keeps its own history; a survivor that finished a step the
    // others did not drops it with rank 0's state.
    history.truncate(*step);
    Ok(())
}
