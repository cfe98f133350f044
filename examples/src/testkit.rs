//! Test kit of the chorus integration tests and test programs: ranks as
//! tasks of one process, random test data, serial references, and a check
//! of every op against the reference.

use std::sync::Arc;
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::test_util::{reference_reduce, Reducible};
use chorus::{Element, ProcessGroup, ReduceOp, TcpOptions};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Element types the tests can fill with small random integers, so that
/// sums, products and means are exact in every order and results can be
/// compared bit for bit with the serial reference.
pub trait TestElem: Element + Reducible {
    /// The value `v` in this type (`u8` takes its absolute value).
    fn from_small(v: i8) -> Self;
}
macro_rules! test_elem {
    ($t:ty, $conv:expr) => {
        impl TestElem for $t {
            fn from_small(v: i8) -> Self {
                let f: fn(i8) -> $t = $conv;
                f(v)
            }
        }
    };
}
test_elem!(f32, |v| v as f32);
test_elem!(f64, |v| v as f64);
test_elem!(f16, |v| f16::from_f32(v as f32));
test_elem!(bf16, |v| bf16::from_f32(v as f32));
test_elem!(i8, |v| v);
test_elem!(u8, |v| v.unsigned_abs());
test_elem!(i32, |v| v as i32);
test_elem!(i64, |v| v as i64);

/// Deterministic random data of `rank` for test case `case`: every rank can
/// compute every other rank's input, hence the reference.
pub fn data<T: TestElem>(case: u64, rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(case.wrapping_mul(1_000_003).wrapping_add(rank as u64));
    (0..len)
        .map(|_| {
            let v: i8 = match op {
                // Small factors keep products exact and in range.
                ReduceOp::Prod => [-2, -1, 1, 2][rng.gen_range(0..4)],
                _ => rng.gen_range(-8..=8),
            };
            T::from_small(v)
        })
        .collect()
}

/// A poison value that no test result equals by chance.
pub fn poison<T: TestElem>(len: usize) -> Vec<T> {
    vec![T::from_small(101); len]
}

/// The serial reference of reducing every rank's [`data`] with `op`.
pub fn reference<T: TestElem>(case: u64, size: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..size).map(|r| data(case, r, len, op)).collect();
    reference_reduce(op, &inputs)
}

/// Builds `size` ranks of one group as tasks of this process, over loopback,
/// sharing one in-memory store.
pub async fn local_groups(size: usize, timeout: Duration) -> Vec<ProcessGroup> {
    local_groups_with(size, timeout, TcpOptions::default()).await
}

/// [`local_groups`] with TCP options.
pub async fn local_groups_with(
    size: usize,
    timeout: Duration,
    tcp: TcpOptions,
) -> Vec<ProcessGroup> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let store = store.clone();
            let tcp = tcp.clone();
            tokio::spawn(async move {
                ProcessGroup::builder()
                    .rank(rank)
                    .world_size(size)
                    .store(store)
                    .timeout(timeout)
                    .tcp_options(tcp)
                    .build()
                    .await
            })
        })
        .collect();
    let mut groups = Vec::new();
    for h in handles {
        groups.push(h.await.expect("rank task").expect("group setup"));
    }
    groups
}

/// Runs `f(group)` on every rank concurrently and returns the results by
/// rank.
pub async fn on_all<F, Fut, R>(groups: &[ProcessGroup], f: F) -> Vec<R>
where
    F: Fn(ProcessGroup) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let handles: Vec<_> = groups.iter().map(|g| tokio::spawn(f(g.clone()))).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("rank task panicked"));
    }
    out
}

/// Sizes (in elements) the op checks use: 0, 1, a prime, and an uneven size
/// large enough for the ring path.
pub const SIZES: [usize; 5] = [0, 1, 13, 4099, 70_001];

/// Every reduce op.
pub const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

fn verify<T: TestElem>(what: String, got: &[T], want: &[T]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b);
    Err(match at {
        Some(i) => format!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        ),
        None => format!("{what}: length {} expected {}", got.len(), want.len()),
    })
}

/// Runs every op on this rank for element type `T` and `sizes`, checking
/// each result against the serial reference; every rank of the group must
/// call it with the same arguments. Returns the number of checks passed, or
/// the first failure.
pub async fn check_all_ops<T: TestElem>(
    pg: &ProcessGroup,
    salt: u64,
    sizes: &[usize],
) -> Result<usize, String> {
    let (rank, size) = (pg.rank(), pg.size());
    fn e<B>(f: chorus::Failed<B>) -> String {
        f.error.to_string()
    }
    let r = |e: chorus::Rejected<_>| e.error.to_string();
    let dt = T::DTYPE;
    let mut checks = 0;
    for (si, &len) in sizes.iter().enumerate() {
        let case = |k: u64| salt * 1_000 + si as u64 * 100 + k;
        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(oi as u64);
            let out = pg
                .all_reduce(data::<T>(c, rank, len, op), op)
                .map_err(r)?
                .await
                .map_err(e)?;
            verify(
                format!("all_reduce {op} {dt} len {len}"),
                &out,
                &reference::<T>(c, size, len, op),
            )?;
            checks += 1;
        }

        let c = case(10);
        let root = (c as usize) % size;
        let buf = if rank == root {
            data::<T>(c, rank, len, ReduceOp::Sum)
        } else {
            poison(len)
        };
        let out = pg
            .broadcast(buf, root)
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        verify(
            format!("broadcast {dt} len {len}"),
            &out,
            &data::<T>(c, root, len, ReduceOp::Sum),
        )?;
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(20 + oi as u64);
            let root = (c as usize + 1) % size;
            let mine = data::<T>(c, rank, len, op);
            let out = pg
                .reduce(mine.clone(), root, op)
                .map_err(|x| x.error.to_string())?
                .await
                .map_err(e)?;
            if rank == root {
                verify(
                    format!("reduce {op} {dt} len {len}"),
                    &out,
                    &reference::<T>(c, size, len, op),
                )?;
            } else {
                verify(
                    format!("reduce leaves non-root unchanged {dt}"),
                    &out,
                    &mine,
                )?;
            }
            checks += 1;
        }

        let c = case(30);
        let (inp, out) = pg
            .all_gather(data::<T>(c, rank, len, ReduceOp::Sum), poison(size * len))
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        verify(
            format!("all_gather input kept {dt}"),
            &inp,
            &data::<T>(c, rank, len, ReduceOp::Sum),
        )?;
        let expect: Vec<T> = (0..size)
            .flat_map(|r| data::<T>(c, r, len, ReduceOp::Sum))
            .collect();
        verify(format!("all_gather {dt} len {len}"), &out, &expect)?;
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(40 + oi as u64);
            let (_, out) = pg
                .reduce_scatter(data::<T>(c, rank, size * len, op), poison(len), op)
                .map_err(|x| x.error.to_string())?
                .await
                .map_err(e)?;
            let full = reference::<T>(c, size, size * len, op);
            verify(
                format!("reduce_scatter {op} {dt} len {len}"),
                &out,
                &full[rank * len..(rank + 1) * len],
            )?;
            checks += 1;
        }

        let c = case(50);
        let (_, out) = pg
            .all_to_all(
                data::<T>(c, rank, size * len, ReduceOp::Sum),
                poison(size * len),
            )
            .map_err(|x| x.error.to_string())?
            .await
            .map_err(e)?;
        let expect: Vec<T> = (0..size)
            .flat_map(|i| {
                data::<T>(c, i, size * len, ReduceOp::Sum)[rank * len..(rank + 1) * len].to_vec()
            })
            .collect();
        verify(format!("all_to_all {dt} len {len}"), &out, &expect)?;
        checks += 1;

        if size > 1 {
            let c = case(60);
            let next = (rank + 1) % size;
            let prev = (rank + size - 1) % size;
            // Both submitted before either is awaited: eager submission.
            let s = pg
                .send(data::<T>(c, rank, len, ReduceOp::Sum), next)
                .map_err(r)?;
            let rv = pg.recv(poison::<T>(len), prev).map_err(r)?;
            let got = rv.await.map_err(e)?;
            s.await.map_err(e)?;
            verify(
                format!("send/recv {dt} len {len}"),
                &got,
                &data::<T>(c, prev, len, ReduceOp::Sum),
            )?;
            checks += 1;
        }
    }
    pg.barrier()
        .map_err(|x| x.error.to_string())?
        .await
        .map_err(e)?;
    Ok(checks + 1)
}

/// [`check_all_ops`] for every dtype; returns the total checks passed.
pub async fn check_all_dtypes(pg: &ProcessGroup, sizes: &[usize]) -> Result<usize, String> {
    use half::{bf16, f16};
    let mut n = check_all_ops::<f32>(pg, 1, sizes).await?;
    n += check_all_ops::<f64>(pg, 2, sizes).await?;
    n += check_all_ops::<f16>(pg, 3, sizes).await?;
    n += check_all_ops::<bf16>(pg, 4, sizes).await?;
    n += check_all_ops::<i8>(pg, 5, sizes).await?;
    n += check_all_ops::<u8>(pg, 6, sizes).await?;
    n += check_all_ops::<i32>(pg, 7, sizes).await?;
    n += check_all_ops::<i64>(pg, 8, sizes).await?;
    Ok(n)
}

/// `target/<profile>` of the running test executable
/// (`target/<profile>/deps/<test>`).
fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf()
}

/// Runs `cargo build <args>` for the profile and target dir of the running
/// test executable.
///
/// # Panics
///
/// If the build fails: test helper only.
fn cargo_build(dir: &std::path::Path, args: &[&str]) {
    let profile = dir
        .file_name()
        .and_then(|p| p.to_str())
        .unwrap_or("debug")
        .to_string();
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.arg("build").args(args);
    if profile == "release" {
        cmd.arg("--release");
    } else if profile != "debug" {
        cmd.args(["--profile", &profile]);
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let status = cmd.status().expect("run cargo");
    assert!(status.success(), "cargo build {} failed", args.join(" "));
}

/// Path of a binary of another workspace package (`chorus-run`,
/// `chorus-trace`) next to the running test executable, building it with
/// cargo if it is not there yet (cargo builds integration tests without the
/// other packages' binaries).
///
/// # Panics
///
/// If the binary cannot be built: test helper only.
pub fn workspace_bin(package: &str, name: &str) -> std::path::PathBuf {
    let dir = profile_dir();
    let path = dir.join(name);
    if !path.exists() {
        cargo_build(&dir, &["-p", package, "--bin", name]);
    }
    path
}

/// Path of example `name` of this package (`target/<profile>/examples/<name>`),
/// building it with cargo if it is missing or older than its source
/// (`cargo test` builds the examples, but `cargo test --test X` does not,
/// and integration tests get no `CARGO_BIN_EXE_` for examples).
///
/// # Panics
///
/// If the example cannot be built: test helper only.
pub fn example_bin(name: &str) -> std::path::PathBuf {
    // The tests of one executable run in parallel: one build at a time.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let dir = profile_dir();
    let path = dir.join("examples").join(name);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{name}.rs"));
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (modified(&path), modified(&src)) {
        (None, _) => true,
        (Some(bin), Some(src)) => bin < src,
        (Some(_), None) => false,
    };
    if stale {
        cargo_build(&dir, &["-p", "chorus-examples", "--example", name]);
    }
    path
}

/// Runs example `name` with `args`, as a program that launches its own
/// ranks (the launcher variables of an enclosing job are removed, so it
/// does not take itself for a rank): its output and its stdout and stderr
/// as one text for assertion messages.
///
/// # Panics
///
/// If the example cannot be built or started: test helper only.
pub fn run_self_launching(name: &str, args: &[&str]) -> (std::process::Output, String) {
    let out = std::process::Command::new(example_bin(name))
        .args(args)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}
