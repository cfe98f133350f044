//! A tensor-parallel MLP on candle, the pattern of candle's
//! llama_multiprocess and of mistral.rs: the up projection is split by
//! columns, the down projection by rows, and one all_reduce joins the
//! ranks' partial outputs.
//!
//! Every rank builds the same full weights from one seed, keeps its shard,
//! runs the sharded forward pass, and checks it against the full MLP
//! computed alone.
//!
//! ```sh
//! # one rank, on GPU 0
//! cargo run --release --example tp_mlp
//! # N ranks, one GPU each (chorus-run, torchrun --no-python or srun)
//! chorus-run --nproc-per-node 2 -- target/release/examples/tp_mlp
//! torchrun --no-python --nproc-per-node 2 target/release/examples/tp_mlp
//! ```
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReduceOp};
use chorus_candle::TensorGroup;
use clap::Parser;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    about = "Tensor-parallel MLP: column- and row-parallel linear layers joined by an all_reduce"
)]
struct Args {
    /// Model width.
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    /// Width of the inner layer (split across the ranks).
    #[arg(long, default_value_t = 4096)]
    ffn: usize,
    /// Rows of the input.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Timed forward passes.
    #[arg(long, default_value_t = 20)]
    iters: usize,
}

/// The job's group: from the launcher's environment, or one rank alone.
async fn group(device: usize) -> Result<ProcessGroup, BoxError> {
    let b = ProcessGroup::builder()
        .device(device)
        .timeout(Duration::from_secs(120));
    if std::env::var_os("RANK").is_some()
        || std::env::var_os("SLURM_PROCID").is_some()
        || std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
    {
        return Ok(b.init_from_env().await?);
    }
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    Ok(b.rank(0).world_size(1).store(store).build().await?)
}

/// This rank's shards of the two weight matrices.
struct Shard {
    /// `[hidden, ffn / size]`: columns of the up projection.
    up: Tensor,
    /// `[ffn / size, hidden]`: rows of the down projection.
    down: Tensor,
}

impl Shard {
    fn of(up: &Tensor, down: &Tensor, rank: usize, size: usize) -> candle_core::Result<Shard> {
        let part = up.dim(1)? / size;
        Ok(Shard {
            up: up.narrow(1, rank * part, part)?.contiguous()?,
            down: down.narrow(0, rank * part, part)?.contiguous()?,
        })
    }

    /// The sharded forward pass: a column-parallel layer, the activation,
    /// a row-parallel layer, and the all_reduce of the partial sums,
    /// stream-ordered (candle's next op waits on the GPU, not the host).
    fn forward(&self, tp: &TensorGroup, x: &Tensor) -> Result<Tensor, BoxError> {
        let h = x.matmul(&self.up)?.relu()?;
        let partial = h.matmul(&self.down)?;
        Ok(tp.all_reduce(&partial, ReduceOp::Sum)?.stream_ordered()?)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn run(args: Args) -> Result<(), BoxError> {
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // A stream of its own, not the per-thread default stream.
    let dev = Device::new_cuda_with_stream(local)?;
    let pg = group(local).await?;
    let (rank, size) = (pg.rank(), pg.size());
    if args.ffn % size != 0 {
        return Err(format!("--ffn {} is not divisible by the {size} ranks", args.ffn).into());
    }
    let tp = TensorGroup::new(pg.clone());

    // The same full model and input on every rank, from one seed.
    dev.set_seed(42)?;
    let scale = 1.0 / (args.hidden as f64).sqrt();
    let up = (Tensor::randn(0f32, 1.0, (args.hidden, args.ffn), &dev)? * scale)?;
    let down = (Tensor::randn(0f32, 1.0, (args.ffn, args.hidden), &dev)? * scale)?;
    let x = Tensor::randn(0f32, 1.0, (args.batch, args.hidden), &dev)?;
    let shard = Shard::of(&up, &down, rank, size)?;

    let y = shard.forward(&tp, &x)?;
    let reference = x.matmul(&up)?.relu()?.matmul(&down)?;
    let err = (&y - &reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
    let norm = reference.abs()?.max_all()?.to_scalar::<f32>()?;
    let ok = err <= 1e-4 * norm.max(1.0);
    // Compared across runs of 1 and N ranks (same seed, same model).
    let checksum = y.sum_all()?.to_scalar::<f32>()?;

    let mut times = Vec::with_capacity(args.iters);
    for _ in 0..args.iters {
        let t = Instant::now();
        let y = shard.forward(&tp, &x)?;
        dev.synchronize()?;
        times.push(t.elapsed());
        drop(y);
    }
    if rank == 0 {
        println!(
            "tp_mlp: {size} rank(s), hidden {}, ffn {} ({} per rank), batch {}: max |sharded - full| = {err:.3e} (max |full| = {norm:.3}) {}; sum of outputs {checksum:.6}; forward with all_reduce: median {:.3} ms over {} passes",
            args.hidden,
            args.ffn,
            args.ffn / size,
            args.batch,
            if ok { "OK" } else { "MISMATCH" },
            median(times).as_secs_f64() * 1e3,
            args.iters,
        );
    }
    pg.shutdown().await?;
    if ok {
        Ok(())
    } else {
        Err(format!("rank {rank}: the sharded MLP differs from the full one by {err}").into())
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tp_mlp: cannot start tokio: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tp_mlp: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
