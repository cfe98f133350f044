//! A rank program whose `main` returns `chorus::Error` with `?`, as a
//! program written from the docs does: for the tests of what such a
//! program prints while it waits for the others and when it fails. Not an
//! example to copy.
//!
//! It joins the job from the environment, runs one all_reduce, checks its
//! sum and leaves.
#![forbid(unsafe_code)]

use chorus::{ProcessGroup, ReduceOp};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), chorus::Error> {
    let pg = ProcessGroup::init_from_env().await?;
    let sum = pg
        .all_reduce(vec![pg.rank() as f32 + 1.0; 4], ReduceOp::Sum)?
        .await?;
    let n = pg.size() as f32;
    assert_eq!(sum, vec![n * (n + 1.0) / 2.0; 4]);
    println!(
        "OK rank={} world_rank={} restarts={} replacement={}",
        pg.rank(),
        pg.world_rank(),
        pg.restarts(),
        pg.is_replacement()
    );
    pg.shutdown().await?;
    Ok(())
}
