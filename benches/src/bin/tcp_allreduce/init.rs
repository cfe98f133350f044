//! `--init-only`: how long a group of this many ranks takes to form
//! (`ProcessGroup::builder().init_from_env()`, the TCP backend's setup
//! included) and to run its first 4-byte all_reduce (connections made on
//! the way included). Rank 0 prints one JSON line:
//!
//! ```text
//! {"impl":"chorus","mode":"init","ranks":N,"init_ms":..,"init_span_ms":..,"first_op_ms":..}
//! ```
//!
//! `init_ms` is the slowest rank's own init call, `init_span_ms` the time
//! from the first rank's call to the last rank's return (epoch clock),
//! `first_op_ms` the slowest rank's first all_reduce.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use chorus::{ProcessGroup, ReduceOp, TcpOptions};

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Forms the group, runs one 4-byte all_reduce, reports.
pub(crate) async fn run(opts: TcpOptions) -> Result<(), Box<dyn std::error::Error>> {
    let start_epoch = epoch_ms();
    let t0 = Instant::now();
    let pg = ProcessGroup::builder()
        .tcp_options(opts)
        .init_from_env()
        .await?;
    let init = t0.elapsed().as_secs_f64() * 1e3;
    let end_epoch = epoch_ms();
    let t1 = Instant::now();
    let v = pg.all_reduce(vec![1.0f32], ReduceOp::Sum)?.await?;
    let first = t1.elapsed().as_secs_f64() * 1e3;
    let n = pg.size();
    if v[0] as usize != n {
        return Err(format!("the first all_reduce gave {} instead of {n}", v[0]).into());
    }
    // The slowest rank's figures, and the span from the earliest start.
    let m = pg
        .all_reduce(vec![init, first, -start_epoch, end_epoch], ReduceOp::Max)?
        .await?;
    if pg.rank() == 0 {
        println!(
            "{}",
            serde_json::json!({
                "impl": "chorus", "mode": "init", "ranks": n,
                "init_ms": m[0], "init_span_ms": m[3] + m[2], "first_op_ms": m[1],
            })
        );
    }
    pg.shutdown().await?;
    Ok(())
}
