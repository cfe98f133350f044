//! `async_trainer --fault-tolerant`: the same model and data, trained by
//! steps that survive lost ranks.
//!
//! Each step computes the batch gradient, all_reduces its buckets (Avg),
//! applies SGD with momentum and checks the parameters' hash on every
//! rank. Every rank, replacements included, runs one loop with
//! [`ProcessGroup::admit`] at the top of a step: every `--admit-every`
//! steps, where it lets in a rank that `chorus-run --max-restarts`
//! restarted (it rejoined from `init_from_env`), and right after a failure
//! or a start. When an op fails (a rank died), the step is abandoned
//! before the optimizer and the next `admit` re-forms the group from the
//! survivors; a replacement's first `admit` returns the group it joined.
//! Whenever `admit` returns a group, its members take the lowest
//! surviving rank's state by broadcast (parameters, momentum, step,
//! initial loss) and re-shard the data over the new world size: the
//! survivors already agree on it (up to a step that some of them finished
//! before the failure), and a replacement gets it before its first step.
//!
//! At the end rank 0 prints the failures seen, the world size of every
//! epoch of the group, and the time from each failure to the first step
//! completed on the next epoch.

use std::time::{Duration, Instant};

use chorus::{ProcessGroup, ReduceOp};
use chorus_examples::BoxError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{make_buckets, print_verdict, Config, Mlp, Shard, FEATURES, ROW};

/// What a surviving rank knows and a replacement is sent.
struct State {
    model: Mlp,
    velocity: Vec<f32>,
    step: usize,
    initial: f64,
}

/// The fault-tolerant run's own knobs.
#[derive(Debug, Clone)]
pub(super) struct FaultConfig {
    /// Members call `admit` every this many steps.
    pub(super) admit_every: usize,
    /// The re-form window.
    pub(super) window: Duration,
    /// Test hook: `(world rank, step)` pairs; that rank SIGKILLs itself in
    /// that step, after submitting its buckets (first start only).
    pub(super) kills: Vec<(usize, usize)>,
}

/// Parses `R@S,R@S` (world rank at step).
pub(super) fn parse_kills(s: &str) -> Result<Vec<(usize, usize)>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (r, st) = p
                .split_once('@')
                .ok_or_else(|| format!("--kill {p}: expected RANK@STEP"))?;
            Ok((
                r.parse().map_err(|_| format!("--kill {p}: bad rank"))?,
                st.parse().map_err(|_| format!("--kill {p}: bad step"))?,
            ))
        })
        .collect()
}

/// A failure seen by this rank: when, at which step, and why.
struct Failure {
    at: Instant,
    step: usize,
    what: String,
    /// Until the first step completed on the group after it.
    recovered: Option<Duration>,
}

/// Everything the run records of its groups.
#[derive(Default)]
struct History {
    failures: Vec<Failure>,
    /// (epoch, world size) of every group this rank was in.
    epochs: Vec<(u64, usize)>,
}

/// Runs the fault-tolerant training on the job's group `pg`; returns the
/// last group (to shut down) and whether the run met its criteria.
pub(super) async fn train(
    mut pg: ProcessGroup,
    cfg: Config,
    ft: FaultConfig,
) -> Result<(ProcessGroup, bool), BoxError> {
    let job_world: usize = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(pg.size());
    let me = pg.members()[pg.rank()];
    let restarted = std::env::var("CHORUS_RANK_RESTARTS").is_ok_and(|v| v != "0");
    let steps_per_epoch = (cfg.samples / (job_world * cfg.batch)).max(1);
    let total = cfg.epochs * steps_per_epoch;
    let h = cfg.hidden;
    let mut hist = History::default();

    // As DDP does: everyone starts from rank 0's parameters.
    let model = Mlp::new(h, cfg.seed.wrapping_add(1000 + me as u64));
    let n = model.params.len();
    let mut st = State {
        model,
        velocity: vec![0.0; n],
        step: 0,
        initial: f64::NAN,
    };
    if !restarted {
        st.model.params = pg
            .broadcast(std::mem::take(&mut st.model.params), 0)?
            .await?;
        let data = Shard::new(cfg.seed, cfg.samples, pg.rank(), pg.size());
        st.initial = eval(&pg, &st.model, &data).await?;
        hist.epochs.push((pg.epoch(), pg.size()));
        if pg.rank() == 0 {
            println!(
                "async trainer (fault-tolerant): {} of {job_world} ranks, MLP {FEATURES}-{h}-1 ({n} params, {} buckets), {} samples, batch {}/rank, {total} steps, admit every {} steps",
                pg.size(),
                cfg.buckets,
                cfg.samples,
                cfg.batch,
                ft.admit_every
            );
        }
    }
    let mut data = Shard::new(cfg.seed, cfg.samples, pg.rank(), pg.size());
    let mut shaped = (pg.epoch(), pg.size());
    let mut grads = vec![0.0f32; n];
    let mut checks = 0usize;

    // `admit` at the top of a step, every `admit_every` steps and right
    // after a failure (it re-forms the failed group) or a start (a
    // replacement's group waits for it); whenever it returns a group, every
    // member takes rank 0's state. Survivors and replacements run this
    // same loop.
    let mut due = true;
    while st.step < total {
        if due || st.step % ft.admit_every == 0 {
            due = false;
            match pg.admit(ft.window).await {
                Ok(Some(g)) => {
                    pg = g;
                    if hist.epochs.last().map(|e| e.0) != Some(pg.epoch()) {
                        hist.epochs.push((pg.epoch(), pg.size()));
                    }
                    if let Err(e) = sync(&pg, &mut st).await {
                        println!("the group failed while taking rank 0's state ({e}); re-forming");
                        due = true;
                        continue;
                    }
                }
                Ok(None) => {}
                // A joiner counted in died before connecting: the next
                // admit forms the epoch after without it.
                Err(chorus::ReformError::Connect { .. }) => {
                    due = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if (pg.epoch(), pg.size()) != shaped {
            // A new group: re-shard over its world size.
            data = Shard::new(cfg.seed, cfg.samples, pg.rank(), pg.size());
            shaped = (pg.epoch(), pg.size());
        }
        match step(&pg, &cfg, &ft, &mut st, &data, &mut grads, me, restarted).await {
            Ok(()) => {
                checks += 1;
                for f in hist.failures.iter_mut().filter(|f| f.recovered.is_none()) {
                    f.recovered = Some(f.at.elapsed());
                }
                if st.step % steps_per_epoch == 0 && pg.rank() == 0 {
                    println!(
                        "step {:>5}/{total} ({} ranks, group epoch {})",
                        st.step,
                        pg.size(),
                        pg.epoch()
                    );
                }
            }
            Err(what) => {
                tracing::warn!(step = st.step, "{what}");
                println!("rank {me}: step {} failed ({what}); re-forming", st.step);
                hist.failures.push(Failure {
                    at: Instant::now(),
                    step: st.step,
                    what,
                    recovered: None,
                });
                due = true;
            }
        }
    }

    // Final checks on the last group: the loss and every parameter's bits.
    let data = Shard::new(cfg.seed, cfg.samples, pg.rank(), pg.size());
    let last = eval(&pg, &st.model, &data).await?;
    let bits: Vec<i32> = st.model.params.iter().map(|p| p.to_bits() as i32).collect();
    let lo = pg.all_reduce(bits.clone(), ReduceOp::Min)?.await?;
    let hi = pg.all_reduce(bits, ReduceOp::Max)?.await?;
    let differing = lo.iter().zip(&hi).filter(|(a, b)| a != b).count();
    let fell = last < st.initial / 2.0;
    if pg.rank() == 0 {
        report(&pg, &hist, st.initial, last, fell, differing, n, checks);
    }
    Ok((pg, fell && differing == 0))
}

/// Takes rank 0's state (parameters, momentum, step, initial loss).
async fn sync(pg: &ProcessGroup, st: &mut State) -> Result<(), BoxError> {
    let p = pg.broadcast(std::mem::take(&mut st.model.params), 0);
    let v = pg.broadcast(std::mem::take(&mut st.velocity), 0);
    let m = pg.broadcast(vec![st.step as f64, st.initial], 0);
    let (p, v, m) = (p?, v?, m?);
    let (p, v, m) = (p.await, v.await, m.await);
    // Keep what comes back (the buffers of a failed op too).
    let restore = |r: Result<Vec<f32>, chorus::Failed<Vec<f32>>>| match r {
        Ok(b) => (b, None),
        Err(f) => {
            let e = f.error().to_string();
            (f.into_buffers().unwrap_or_default(), Some(e))
        }
    };
    let (params, e1) = restore(p);
    let (velocity, e2) = restore(v);
    if !params.is_empty() {
        st.model.params = params;
    }
    if !velocity.is_empty() {
        st.velocity = velocity;
    }
    if let Some(e) = e1.or(e2) {
        return Err(e.into());
    }
    let m = m?;
    st.step = m[0] as usize;
    st.initial = m[1];
    Ok(())
}

/// The mean squared error over the group's shards.
async fn eval(pg: &ProcessGroup, model: &Mlp, data: &Shard) -> Result<f64, BoxError> {
    let sse = model.sse(data);
    let v = pg
        .all_reduce(vec![sse, data.len() as f64], ReduceOp::Sum)?
        .await?;
    Ok(v[0] / v[1].max(1.0))
}

/// One step; `Err` with what failed if an op did (the parameters are then
/// as before the step, or a whole step ahead where only the hash check
/// failed: the next sync settles it).
#[allow(clippy::too_many_arguments)]
async fn step(
    pg: &ProcessGroup,
    cfg: &Config,
    ft: &FaultConfig,
    st: &mut State,
    data: &Shard,
    grads: &mut [f32],
    me: usize,
    restarted: bool,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ ((st.step as u64) << 20) ^ pg.rank() as u64);
    let idx: Vec<usize> = (0..cfg.batch)
        .map(|_| rng.gen_range(0..data.len().max(1)))
        .collect();
    gradient(&st.model, data, &idx, grads);
    let mut works = Vec::new();
    for bk in make_buckets(cfg.hidden, cfg.buckets) {
        let part = grads[bk.range.clone()].to_vec();
        works.push((bk.range, pg.all_reduce(part, ReduceOp::Avg)));
    }
    if !restarted && ft.kills.contains(&(me, st.step)) {
        println!("VICTIM rank={me} step={} killing itself", st.step);
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    let mut failed: Option<String> = None;
    for (range, w) in works {
        match w {
            Err(rejected) => failed = failed.or(Some(rejected.error.to_string())),
            Ok(w) => match w.await {
                Ok(b) => grads[range].copy_from_slice(&b),
                Err(f) => failed = failed.or(Some(f.error().to_string())),
            },
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    for ((p, v), gr) in st
        .model
        .params
        .iter_mut()
        .zip(&mut st.velocity)
        .zip(&*grads)
    {
        *v = cfg.momentum * *v + gr;
        *p -= cfg.lr * *v;
    }
    st.step += 1;
    let mine = st.model.hash() as i64;
    let hashes = pg
        .all_gather(vec![mine], vec![0; pg.size()])
        .map_err(|r| r.error.to_string())?
        .await
        .map_err(|f| f.error().to_string())?
        .1;
    if hashes.iter().any(|&v| v != hashes[0]) {
        // Not a failure to recover from: a bug.
        eprintln!("PARAMETERS DIVERGED after step {}: {hashes:x?}", st.step);
        std::process::exit(1);
    }
    Ok(())
}

/// The batch gradient of the MSE, in the flat layout of [`Mlp`].
fn gradient(model: &Mlp, data: &Shard, idx: &[usize], grads: &mut [f32]) {
    let h = model.hidden;
    let b = idx.len();
    let mut acts = vec![0.0f32; b * h];
    let mut g = vec![0.0f32; b];
    for (s, &i) in idx.iter().enumerate() {
        let y = model.predict(data.x(i), &mut acts[s * h..(s + 1) * h]);
        g[s] = 2.0 * (y - data.y[i]) / b as f32;
    }
    for j in 0..h {
        grads[j] = (0..b).map(|s| g[s] * acts[s * h + j]).sum();
    }
    grads[h] = g.iter().sum();
    for j in 0..h {
        let w2 = model.params[j];
        let o = model.unit(j);
        let row = &mut grads[o..o + ROW];
        row.fill(0.0);
        for (s, &i) in idx.iter().enumerate() {
            let a = acts[s * h + j];
            let d = g[s] * w2 * (1.0 - a * a);
            for (gw, &xv) in row[..FEATURES].iter_mut().zip(data.x(i)) {
                *gw += d * xv;
            }
            row[FEATURES] += d;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    pg: &ProcessGroup,
    hist: &History,
    initial: f64,
    last: f64,
    fell: bool,
    differing: usize,
    n: usize,
    checks: usize,
) {
    println!("failures seen: {}", hist.failures.len());
    for f in &hist.failures {
        println!("  at step {}: {}", f.step, f.what);
    }
    let sizes: Vec<String> = hist
        .epochs
        .iter()
        .map(|(e, s)| format!("epoch {e}: {s}"))
        .collect();
    println!("world size per epoch: {}", sizes.join(", "));
    let times: Vec<String> = hist
        .failures
        .iter()
        .map(|f| match f.recovered {
            Some(d) => format!("{:.1} ms", d.as_secs_f64() * 1e3),
            None => "never".into(),
        })
        .collect();
    println!(
        "time from each failure to the first step of the next epoch: [{}]",
        times.join(", ")
    );
    print_verdict(initial, last, fell, differing, pg.size(), checks, n);
}
