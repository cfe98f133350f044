//! Multi-rank tests of the TCP backend: N backends in one process over
//! loopback, ops submitted directly, results checked against serial
//! references on random data.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::{OpContext, OpFuture, Registry, WorkError};
use chorus_store::{Store, StoreError};
use futures::executor::block_on;
use futures::future::join_all;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use chorus_core::{DType, HostBuffer, Op, ReduceOp};

use super::backend::TcpBackend;
use super::options::TcpOptions;
use super::request::OpRequest;
use crate::backend::Backend;
use crate::reduce::{reference_reduce, Reducible};
use crate::work::Assist;

/// The buffers an op comes back with.
type OpOutput = Vec<HostBuffer>;

/// An op with its buffers, as these tests write them.
#[derive(Debug)]
enum Call {
    AllReduce {
        buf: HostBuffer,
        op: ReduceOp,
    },
    Broadcast {
        buf: HostBuffer,
        root: usize,
    },
    Reduce {
        buf: HostBuffer,
        root: usize,
        op: ReduceOp,
    },
    AllGather {
        input: HostBuffer,
        output: HostBuffer,
    },
    ReduceScatter {
        input: HostBuffer,
        output: HostBuffer,
        op: ReduceOp,
    },
    AllToAll {
        input: HostBuffer,
        output: HostBuffer,
    },
    Send {
        buf: HostBuffer,
        peer: usize,
    },
    Recv {
        buf: HostBuffer,
        peer: usize,
    },
    Barrier,
}

impl Call {
    fn into_parts(self) -> (Op, Vec<HostBuffer>) {
        match self {
            Call::AllReduce { buf, op } => (Op::AllReduce(op), vec![buf]),
            Call::Broadcast { buf, root } => (Op::Broadcast { root }, vec![buf]),
            Call::Reduce { buf, root, op } => (Op::Reduce { root, op }, vec![buf]),
            Call::AllGather { input, output } => (Op::AllGather, vec![input, output]),
            Call::ReduceScatter { input, output, op } => {
                (Op::ReduceScatter(op), vec![input, output])
            }
            Call::AllToAll { input, output } => (Op::AllToAll, vec![input, output]),
            Call::Send { buf, peer } => (Op::Send { peer }, vec![buf]),
            Call::Recv { buf, peer } => (Op::Recv { peer }, vec![buf]),
            Call::Barrier => (Op::Barrier, Vec::new()),
        }
    }
}

/// A tiny in-memory store: a map and a notifier.
#[derive(Debug, Default)]
struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: tokio::sync::Notify,
}

fn unsupported() -> StoreError {
    StoreError::Protocol("not supported by the test store".into())
}

#[async_trait::async_trait]
impl Store for MemStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.map.lock().unwrap().insert(key.into(), value.to_vec());
        self.changed.notify_waiters();
        Ok(())
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(v) = self.map.lock().unwrap().get(key) {
                return Ok(v.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(StoreError::Timeout {
                    keys: vec![key.into()],
                    after: timeout,
                });
            }
        }
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let mut map = self.map.lock().unwrap();
        let old = map
            .get(key)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
            .unwrap_or(0);
        map.insert(key.into(), (old + delta).to_string().into_bytes());
        drop(map);
        self.changed.notify_waiters();
        Ok(old + delta)
    }

    async fn compare_set(&self, _: &str, _: &[u8], _: &[u8]) -> Result<Vec<u8>, StoreError> {
        Err(unsupported())
    }

    async fn wait(&self, _: &[&str], _: Duration) -> Result<(), StoreError> {
        Err(unsupported())
    }

    async fn check(&self, _: &[&str]) -> Result<bool, StoreError> {
        Err(unsupported())
    }

    async fn delete(&self, _: &str) -> Result<bool, StoreError> {
        Err(unsupported())
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        Err(unsupported())
    }

    async fn multi_get(&self, _: &[&str], _: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        Err(unsupported())
    }

    async fn multi_set(&self, _: &[(&str, &[u8])]) -> Result<(), StoreError> {
        Err(unsupported())
    }
}

const TIMEOUT: Duration = Duration::from_secs(20);

/// One rank of a test world.
struct Rank {
    be: Arc<TcpBackend>,
    group: Arc<str>,
    seq: u64,
    p2p: HashMap<(usize, usize), u64>,
}

impl Rank {
    /// A rank of group "g".
    fn of(be: Arc<TcpBackend>) -> Rank {
        Rank {
            be,
            group: "g".into(),
            seq: 0,
            p2p: HashMap::new(),
        }
    }

    fn rank(&self) -> usize {
        self.be.rank()
    }

    /// The request of op `kind` at `seq`, and its work.
    fn request(&self, seq: u64, kind: Call, timeout: Duration) -> (OpFuture<OpOutput>, OpRequest) {
        let (op, bufs) = kind.into_parts();
        let ctx = OpContext {
            rank: self.rank(),
            group: self.group.clone(),
            seq,
            op: op.name(),
            internal: None,
        };
        // A registry per op: these tests check the backend's own failure
        // handling, so the registry's abort-on-error (which refuses later
        // submissions before they reach the backend) must not step in.
        let reg = Arc::new(Registry::new());
        let (work, completer) =
            OpFuture::new(ctx.clone(), &reg, None).expect("registry refused the op");
        let req = OpRequest {
            ctx,
            op,
            bufs,
            timeout,
            completer,
        };
        (work, req)
    }

    fn submit_at(&self, seq: u64, kind: Call, timeout: Duration) -> OpFuture<OpOutput> {
        let (work, req) = self.request(seq, kind, timeout);
        self.be.enqueue(req);
        work
    }

    /// Submits a collective with the next collective seq the way the
    /// group's submit does: a small op that finds the worker waiting is
    /// started on this thread, and comes with the driver that runs the
    /// rest on the caller's thread.
    fn coll_assisted(&mut self, kind: Call) -> (OpFuture<OpOutput>, Option<Arc<dyn Assist>>) {
        self.seq += 1;
        let (work, req) = self.request(self.seq, kind, TIMEOUT);
        let assist = self.be.start_then(req, || ());
        (work, assist)
    }

    /// Submits a collective with the next collective seq.
    fn coll(&mut self, kind: Call) -> OpFuture<OpOutput> {
        self.seq += 1;
        self.submit_at(self.seq, kind, TIMEOUT)
    }

    /// Submits a send or recv with the pair-direction message number.
    fn p2p(&mut self, kind: Call) -> OpFuture<OpOutput> {
        let me = self.rank();
        let key = match &kind {
            Call::Send { peer, .. } => (me, *peer),
            Call::Recv { peer, .. } => (*peer, me),
            _ => unreachable!("not a p2p op"),
        };
        let n = self.p2p.entry(key).or_insert(0);
        *n += 1;
        let seq = *n;
        self.submit_at(seq, kind, TIMEOUT)
    }
}

static GROUPS: AtomicUsize = AtomicUsize::new(0);

fn world(n: usize, opts: &TcpOptions) -> Vec<Rank> {
    world_with(&vec![opts.clone(); n])
}

/// A world whose rank `r` uses `opts[r]`.
fn world_with(opts: &[TcpOptions]) -> Vec<Rank> {
    let n = opts.len();
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let group: Arc<str> = format!("test-{}", GROUPS.fetch_add(1, Ordering::Relaxed)).into();
    let bes = block_on(join_all((0..n).map(|r| {
        TcpBackend::connect(store.clone(), r, n, group.clone(), opts[r].clone(), false)
    })));
    bes.into_iter()
        .map(|b| Rank {
            be: b.expect("setup failed"),
            group: group.clone(),
            seq: 0,
            p2p: HashMap::new(),
        })
        .collect()
}

/// Small chunk and crossover, so that small data exercises the ring and
/// chain paths with many chunks.
fn small_opts() -> TcpOptions {
    TcpOptions {
        crossover_bytes: 2048,
        chunk_bytes: 512,
        ..TcpOptions::default()
    }
}

/// Loopback TCP only (no Unix sockets).
fn tcp_opts() -> TcpOptions {
    TcpOptions {
        local_unix_sockets: false,
        ..small_opts()
    }
}

fn tcp_opts_default() -> TcpOptions {
    TcpOptions {
        local_unix_sockets: false,
        ..TcpOptions::default()
    }
}

fn from_i64(dtype: DType, v: &[i64]) -> HostBuffer {
    match dtype {
        DType::F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
        DType::F64 => HostBuffer::F64(v.iter().map(|&x| x as f64).collect()),
        DType::F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f32(x as f32)).collect()),
        DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| bf16::from_f32(x as f32)).collect()),
        DType::I8 => HostBuffer::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
        DType::I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
        DType::I64 => HostBuffer::I64(v.to_vec()),
        DType::U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
        DType::U64 => HostBuffer::U64(v.iter().map(|&x| x as u64).collect()),
    }
}

/// Random integer-valued data (exact in every dtype, so every reduction
/// order gives the same bits); products use +-1 and +-2. A xorshift seeded
/// from `rng` keeps large buffers cheap in debug builds.
fn gen(rng: &mut StdRng, dtype: DType, len: usize, op: ReduceOp) -> HostBuffer {
    let mut x: u64 = rng.gen::<u64>() | 1;
    let v: Vec<i64> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if op == ReduceOp::Prod {
                [-2, -1, 1, 2][(x >> 40) as usize % 4]
            } else {
                ((x >> 40) % 17) as i64 - 8
            }
        })
        .collect();
    from_i64(dtype, &v)
}

fn reference_t<T: Reducible>(op: ReduceOp, inputs: &[HostBuffer]) -> HostBuffer {
    let v: Vec<Vec<T>> = inputs
        .iter()
        .map(|b| T::from_host(b.clone()).expect("dtype"))
        .collect();
    T::into_host(reference_reduce(op, &v))
}

fn reference(op: ReduceOp, inputs: &[HostBuffer]) -> HostBuffer {
    match inputs[0].dtype() {
        DType::F32 => reference_t::<f32>(op, inputs),
        DType::F64 => reference_t::<f64>(op, inputs),
        DType::F16 => reference_t::<f16>(op, inputs),
        DType::BF16 => reference_t::<bf16>(op, inputs),
        DType::I8 => reference_t::<i8>(op, inputs),
        DType::U8 => reference_t::<u8>(op, inputs),
        DType::I32 => reference_t::<i32>(op, inputs),
        DType::I64 => reference_t::<i64>(op, inputs),
        DType::U32 => reference_t::<u32>(op, inputs),
        DType::U64 => reference_t::<u64>(op, inputs),
    }
}

/// Elements `r` of `b` as bytes.
fn elems(b: &HostBuffer, r: std::ops::Range<usize>) -> &[u8] {
    let es = b.dtype().size();
    &b.as_bytes()[r.start * es..r.end * es]
}

fn wait_all(works: Vec<OpFuture<OpOutput>>) -> Vec<OpOutput> {
    block_on(join_all(works))
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("op failed: {e}")))
        .collect()
}

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// Every op, dtype and world size 1..=5, sizes 0, 1, a prime and one above
/// the crossover with an uneven split, against serial references. Even world
/// sizes connect over TCP, odd ones over Unix sockets.
#[test]
fn every_op_matches_reference() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for n in 1..=5 {
        let opts = TcpOptions {
            local_unix_sockets: n % 2 == 1,
            ..small_opts()
        };
        let mut w = world(n, &opts);
        for (di, dtype) in DType::ALL.into_iter().enumerate() {
            let big = 3 * opts.crossover_bytes / dtype.size() + 1;
            for (si, len) in [0usize, 1, 13, big].into_iter().enumerate() {
                check_batch(&mut w, &mut rng, dtype, len, di + si);
            }
        }
    }
}

/// Chunks large enough that the worker reads payloads from the socket
/// straight into the op's buffer (the reader lends it its read side), with
/// every op of a batch queued before any is awaited, so that frames of later
/// ops arrive while earlier ones run; over Unix sockets and TCP.
#[test]
fn large_frames_read_straight_into_buffers() {
    let mut rng = StdRng::seed_from_u64(0x1e47);
    for (n, unix) in [(2, true), (3, false), (4, true)] {
        let opts = TcpOptions {
            crossover_bytes: 64 << 10,
            chunk_bytes: 64 << 10,
            local_unix_sockets: unix,
            // Large payloads through the sockets (shared memory has tests
            // of its own).
            shared_memory: false,
            ..TcpOptions::default()
        };
        let mut w = world(n, &opts);
        for (salt, dtype) in [DType::F32, DType::I8].into_iter().enumerate() {
            // Several chunks per block, uneven.
            let len = (3 * (64 << 10) + 4097) / dtype.size();
            check_batch(&mut w, &mut rng, dtype, len, salt);
            check_batch(&mut w, &mut rng, dtype, len, salt + 2);
        }
    }
}

/// Local Unix sockets with shared memory, chunks well above
/// [`shm::SHM_MIN`](super::shm::SHM_MIN).
fn shm_opts() -> TcpOptions {
    TcpOptions {
        crossover_bytes: 64 << 10,
        chunk_bytes: 64 << 10,
        local_unix_sockets: true,
        shared_memory: true,
        ..TcpOptions::default()
    }
}

/// Bytes all slots of one direction hold with [`shm_opts`].
fn shm_capacity() -> usize {
    super::shm::slot_count(64 << 10) * (64 << 10)
}

/// Shared-memory segments are anonymous (memfd): nothing of chorus's ever
/// appears in `/dev/shm`.
fn assert_no_shm_files() {
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            assert!(!name.contains("chorus"), "left in /dev/shm: {name}");
        }
    }
}

/// This process maps some chorus shared-memory segment.
fn maps_a_segment() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("chorus-tcp-shm"))
}

/// Every op (send/recv included) over shared memory, 2 to 4 ranks, with
/// payloads just above the threshold, not a multiple of the slot size, and
/// more than all slots of a direction hold together (every op of a batch is
/// queued before any is awaited, so slots also run out and frames fall back
/// to the socket), against serial references; the slots were really used.
#[test]
fn shared_memory_ops_match_reference() {
    let mut rng = StdRng::seed_from_u64(0x5a3e);
    let big = (shm_capacity() + 3 * (64 << 10)) / 4 + 13;
    for n in 2..=4 {
        let mut w = world(n, &shm_opts());
        assert!(
            cfg!(not(target_os = "linux")) || maps_a_segment(),
            "no segment mapped"
        );
        for (salt, (dtype, len)) in [
            (DType::F32, 5000),
            (DType::F32, (3 * (64 << 10) + 4097) / 4),
            (DType::I8, 70_001),
            (DType::F64, big / 2),
        ]
        .into_iter()
        .enumerate()
        {
            check_batch(&mut w, &mut rng, dtype, len, salt + n);
        }
        for rk in &w {
            let (sent, _) = rk.be.shm_stats();
            assert!(
                cfg!(not(target_os = "linux")) || sent > 0,
                "rank {} of {n} sent nothing through shared memory",
                rk.rank()
            );
        }
    }
    assert_no_shm_files();
}

/// Every op through the shared-memory pipes between local ranks (the
/// default options: Unix sockets, shared memory), at sizes 0, 1, a prime,
/// the crossover and its neighbours (direct on one side, ring on the other
/// in bytes), on 3 and 4 ranks, and 16 MiB on 3, against serial
/// references.
#[test]
fn every_op_through_pipes_at_the_crossovers_and_16_mib() {
    let mut rng = StdRng::seed_from_u64(0x91be);
    let opts = TcpOptions::default();
    for n in [3, 4] {
        let mut w = world(n, &opts);
        let mut salt = n;
        for dtype in [DType::F32, DType::I64, DType::BF16] {
            let cross = opts.crossover_bytes / dtype.size();
            for len in [0, 1, 13, cross - 1, cross, cross + 1] {
                check_batch(&mut w, &mut rng, dtype, len, salt);
                salt += 1;
            }
        }
        if n == 3 {
            check_batch(&mut w, &mut rng, DType::F32, (16 << 20) / 4, salt);
        }
    }
    assert_no_shm_files();
}

/// With `shared_memory` off on every rank, or on one rank of a pair only,
/// payloads go through the socket (and results stay right).
#[test]
fn shared_memory_can_be_turned_off() {
    let mut rng = StdRng::seed_from_u64(0x0ff);
    let off = TcpOptions {
        shared_memory: false,
        ..shm_opts()
    };
    for opts in [
        vec![off.clone(), off.clone()],
        vec![shm_opts(), off.clone(), shm_opts()],
    ] {
        let mut w = world_with(&opts);
        check_batch(&mut w, &mut rng, DType::F32, 40_000, 1);
        for (r, rk) in w.iter().enumerate() {
            let (sent, full) = rk.be.shm_stats();
            if !opts[r].shared_memory || opts.iter().all(|o| !o.shared_memory) {
                assert_eq!((sent, full), (0, 0), "rank {r} used shared memory");
            }
        }
        // Ranks 0 and 2 both offer it: that pair uses it.
        if opts.len() == 3 && cfg!(target_os = "linux") {
            assert!(w[0].be.shm_stats().0 > 0 && w[2].be.shm_stats().0 > 0);
        }
    }
    assert_no_shm_files();
}

/// A receiver that stops reading never blocks the sender (slots that run
/// out make it fall back to the socket), and when it then dies (abort: its
/// connections close) with slots still full, the sender's next op fails
/// with `PeerLost` naming it, well before the op's timeout.
#[test]
fn a_peer_that_dies_holding_slots_fails_the_sender_without_a_hang() {
    let mut w = world(2, &shm_opts());
    let mut rng = StdRng::seed_from_u64(0xdead);
    // Twice what the slots hold, never received by rank 1.
    let len = 2 * shm_capacity() / 4;
    let s = w[0].p2p(Call::Send {
        buf: gen(&mut rng, DType::F32, len, ReduceOp::Sum),
        peer: 1,
    });
    wait_all(vec![s]);
    let (sent, full) = w[0].be.shm_stats();
    if cfg!(target_os = "linux") {
        assert!(sent > 0 && full > 0, "sent {sent}, full {full}");
    }
    w[0].seq += 1;
    let a = w[0].submit_at(
        w[0].seq,
        Call::AllReduce {
            buf: gen(&mut rng, DType::F32, len, ReduceOp::Sum),
            op: ReduceOp::Sum,
        },
        Duration::from_secs(600),
    );
    w[1].be.die(&aborted(1));
    let e = expect_err(a);
    match e {
        WorkError::PeerLost { peer, .. } => assert_eq!(peer, 1),
        e => panic!("expected PeerLost, got {e}"),
    }
    assert_no_shm_files();
}

/// One batch: every op once (all_reduce with every reduce op) on every
/// rank, all submitted before any is awaited.
fn check_batch(w: &mut [Rank], rng: &mut StdRng, dtype: DType, len: usize, salt: usize) {
    let n = w.len();
    let redop = OPS[salt % OPS.len()];
    let root_b = salt % n;
    let root_r = (salt + 1) % n;
    // Inputs per rank.
    let ar_in: Vec<Vec<HostBuffer>> = OPS
        .iter()
        .map(|&op| (0..n).map(|_| gen(rng, dtype, len, op)).collect())
        .collect();
    let bc_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, len, redop)).collect();
    let rd_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, len, redop)).collect();
    let ag_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, len, redop)).collect();
    let rs_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, n * len, redop)).collect();
    let aa_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, n * len, redop)).collect();
    let p2p_in: Vec<HostBuffer> = (0..n).map(|_| gen(rng, dtype, len, redop)).collect();

    let mut works: Vec<Vec<OpFuture<OpOutput>>> = Vec::new();
    for (r, rk) in w.iter_mut().enumerate() {
        let mut v = Vec::new();
        for (i, &op) in OPS.iter().enumerate() {
            v.push(rk.coll(Call::AllReduce {
                buf: ar_in[i][r].clone(),
                op,
            }));
        }
        v.push(rk.coll(Call::Broadcast {
            buf: bc_in[r].clone(),
            root: root_b,
        }));
        v.push(rk.coll(Call::Reduce {
            buf: rd_in[r].clone(),
            root: root_r,
            op: redop,
        }));
        v.push(rk.coll(Call::AllGather {
            input: ag_in[r].clone(),
            output: gen(rng, dtype, n * len, redop),
        }));
        v.push(rk.coll(Call::ReduceScatter {
            input: rs_in[r].clone(),
            output: gen(rng, dtype, len, redop),
            op: redop,
        }));
        v.push(rk.coll(Call::AllToAll {
            input: aa_in[r].clone(),
            output: gen(rng, dtype, n * len, redop),
        }));
        v.push(rk.coll(Call::Barrier));
        if n > 1 {
            // Everyone sends first, then receives.
            v.push(rk.p2p(Call::Send {
                buf: p2p_in[r].clone(),
                peer: (r + 1) % n,
            }));
            v.push(rk.p2p(Call::Recv {
                buf: gen(rng, dtype, len, redop),
                peer: (r + n - 1) % n,
            }));
        }
        works.push(v);
    }
    let outs: Vec<Vec<OpOutput>> = works.into_iter().map(wait_all).collect();
    let what = |op: &str| format!("{op} n={n} {dtype} len={len}");

    for (i, &op) in OPS.iter().enumerate() {
        let want = reference(op, &ar_in[i]);
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(
                o[i][0].as_bytes(),
                want.as_bytes(),
                "{} {op} rank {r}",
                what("all_reduce")
            );
        }
    }
    let mut k = OPS.len();
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o[k][0], bc_in[root_b], "{} rank {r}", what("broadcast"));
    }
    k += 1;
    let want = reference(redop, &rd_in);
    for (r, o) in outs.iter().enumerate() {
        let expect = if r == root_r { &want } else { &rd_in[r] };
        assert_eq!(
            o[k][0].as_bytes(),
            expect.as_bytes(),
            "{} {redop} rank {r}",
            what("reduce")
        );
    }
    k += 1;
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o[k][0], ag_in[r], "all_gather input changed");
        for (p, inp) in ag_in.iter().enumerate() {
            assert_eq!(
                elems(&o[k][1], p * len..(p + 1) * len),
                inp.as_bytes(),
                "{} rank {r} block {p}",
                what("all_gather")
            );
        }
    }
    k += 1;
    let want = reference(redop, &rs_in);
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(o[k][0], rs_in[r], "reduce_scatter input changed");
        assert_eq!(
            o[k][1].as_bytes(),
            elems(&want, r * len..(r + 1) * len),
            "{} {redop} rank {r}",
            what("reduce_scatter")
        );
    }
    k += 1;
    for (r, o) in outs.iter().enumerate() {
        for (p, inp) in aa_in.iter().enumerate() {
            assert_eq!(
                elems(&o[k][1], p * len..(p + 1) * len),
                elems(inp, r * len..(r + 1) * len),
                "{} rank {r} block {p}",
                what("all_to_all")
            );
        }
    }
    k += 1;
    for o in &outs {
        assert!(o[k].is_empty(), "barrier returns no buffers");
    }
    k += 1;
    if n > 1 {
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(o[k][0], p2p_in[r], "send gives its buffer back");
            assert_eq!(
                o[k + 1][0],
                p2p_in[(r + n - 1) % n],
                "{} rank {r}",
                what("recv")
            );
        }
    }
}

fn random_f32(rng: &mut StdRng, len: usize) -> HostBuffer {
    HostBuffer::F32((0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
}

/// Non-integer floats: every rank gets the same bits on both paths, close
/// to the rank-order reference.
#[test]
fn float_results_are_bit_identical_on_every_rank() {
    let opts = small_opts();
    let mut rng = StdRng::seed_from_u64(7);
    for n in [3, 4] {
        let mut w = world(n, &opts);
        for len in [101, 4099] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let ins: Vec<HostBuffer> = (0..n).map(|_| random_f32(&mut rng, len)).collect();
                let works = w
                    .iter_mut()
                    .zip(&ins)
                    .map(|(rk, b)| rk.coll(Call::AllReduce { buf: b.clone(), op }))
                    .collect();
                let outs = wait_all(works);
                for o in &outs {
                    assert_eq!(
                        o[0].as_bytes(),
                        outs[0][0].as_bytes(),
                        "n={n} len={len} {op}"
                    );
                }
                // Doubling and the ring reduce in another order than the
                // reference: close, not equal.
                let want = reference(op, &ins);
                let (HostBuffer::F32(got), HostBuffer::F32(want)) = (&outs[0][0], &want) else {
                    unreachable!()
                };
                for (g, e) in got.iter().zip(want) {
                    assert!((g - e).abs() <= 1e-5 * n as f32, "{g} vs {e}");
                }
            }
        }
    }
}

fn expect_err(w: OpFuture<OpOutput>) -> WorkError {
    match block_on(w) {
        Ok(_) => panic!("op succeeded but should have failed"),
        Err(f) => f.error,
    }
}

#[test]
fn mismatched_ops_name_both_sides() {
    let w = world(2, &tcp_opts());
    let a = w[0].submit_at(
        7,
        Call::AllReduce {
            buf: HostBuffer::F32(vec![1.0; 12]),
            op: ReduceOp::Sum,
        },
        TIMEOUT,
    );
    let b = w[1].submit_at(
        7,
        Call::AllGather {
            input: HostBuffer::F32(vec![1.0; 10]),
            output: HostBuffer::F32(vec![0.0; 20]),
        },
        TIMEOUT,
    );
    let (ea, eb) = (expect_err(a), expect_err(b));
    assert!(
        matches!(&ea, WorkError::Mismatch { detail, .. }
            if detail == "rank 1 at seq 7 called all_gather(count=10) but rank 0 called all_reduce(count=12)"),
        "{ea}"
    );
    assert!(
        matches!(&eb, WorkError::Mismatch { detail, .. }
            if detail == "rank 0 at seq 7 called all_reduce(count=12) but rank 1 called all_gather(count=10)"),
        "{eb}"
    );
    // The group is failed: later ops fail with the same cause.
    let c = w[0].submit_at(8, Call::Barrier, TIMEOUT);
    let ec = expect_err(c);
    assert!(
        matches!(&ec, WorkError::Mismatch { ctx, .. } if ctx.seq == 8 && ctx.op == "barrier"),
        "{ec}"
    );
}

/// Mismatches where the two sides take different paths (ring vs direct),
/// differ in dtype, or disagree on the root.
#[test]
fn mismatches_of_size_dtype_and_root() {
    let cases: Vec<(Call, Call, &str)> = vec![
        (
            Call::AllReduce {
                buf: HostBuffer::F32(vec![1.0; 100_000]),
                op: ReduceOp::Sum,
            },
            Call::AllReduce {
                buf: HostBuffer::F32(vec![1.0; 12]),
                op: ReduceOp::Sum,
            },
            "called all_reduce(count=12)",
        ),
        (
            Call::AllReduce {
                buf: HostBuffer::F32(vec![1.0; 12]),
                op: ReduceOp::Sum,
            },
            Call::AllReduce {
                buf: HostBuffer::F64(vec![1.0; 12]),
                op: ReduceOp::Max,
            },
            "called all_reduce(count=12, dtype=f64, op=max)",
        ),
        (
            Call::Broadcast {
                buf: HostBuffer::I32(vec![1; 5]),
                root: 0,
            },
            Call::Broadcast {
                buf: HostBuffer::I32(vec![1; 5]),
                root: 1,
            },
            "called broadcast(count=5, root=1)",
        ),
        (
            Call::Reduce {
                buf: HostBuffer::I32(vec![1; 5000]),
                root: 0,
                op: ReduceOp::Sum,
            },
            Call::Reduce {
                buf: HostBuffer::I32(vec![1; 5000]),
                root: 1,
                op: ReduceOp::Sum,
            },
            "called reduce(count=5000, root=1)",
        ),
        (
            Call::Broadcast {
                buf: HostBuffer::U8(vec![1; 5000]),
                root: 0,
            },
            Call::Broadcast {
                buf: HostBuffer::U8(vec![1; 5000]),
                root: 1,
            },
            "called broadcast(count=5000, root=1)",
        ),
    ];
    for (k0, k1, rank1_says) in cases {
        let mut w = world(2, &small_opts());
        let a = w[0].coll(k0);
        let b = w[1].coll(k1);
        let (ea, eb) = (expect_err(a), expect_err(b));
        assert!(matches!(&ea, WorkError::Mismatch { .. }), "{ea}");
        assert!(matches!(&eb, WorkError::Mismatch { .. }), "{eb}");
        assert!(ea.to_string().contains(rank1_says), "{ea}");
    }
}

#[test]
fn recv_of_a_different_length_is_a_mismatch() {
    let mut w = world(2, &small_opts());
    let a = w[0].p2p(Call::Send {
        buf: HostBuffer::F32(vec![1.0; 10]),
        peer: 1,
    });
    let b = w[1].p2p(Call::Recv {
        buf: HostBuffer::F32(vec![0.0; 12]),
        peer: 0,
    });
    assert!(block_on(a).is_ok());
    let e = expect_err(b);
    assert!(
        matches!(&e, WorkError::Mismatch { detail, .. }
            if detail == "rank 0 at seq 1 called send(count=10) but rank 1 called recv(count=12)"),
        "{e}"
    );
}

/// A recv whose send never comes times out; the group is failed (queued
/// and later ops fail with the timeout) and its connections closed after a
/// fault notice, so the peer fails at once with the timeout as the cause.
#[test]
fn an_op_the_peer_never_matches_times_out_and_fails_the_group() {
    let mut w = world(2, &small_opts());
    let a = w[0].submit_at(
        1,
        Call::Recv {
            buf: HostBuffer::F32(vec![0.0; 4]),
            peer: 1,
        },
        Duration::from_millis(200),
    );
    let queued = w[0].coll(Call::Barrier);
    let e = expect_err(a);
    assert!(matches!(e, WorkError::OpTimeout { .. }), "{e}");
    let e = expect_err(queued);
    assert!(
        matches!(&e, WorkError::OpTimeout { ctx, .. } if ctx.op == "barrier"),
        "{e}"
    );
    let later = w[0].coll(Call::Barrier);
    assert!(matches!(expect_err(later), WorkError::OpTimeout { .. }));
    // Rank 0's fault notice names the cause.
    let b = w[1].coll(Call::Barrier);
    let e = expect_err(b);
    assert!(
        matches!(&e, WorkError::Remote { origin: 0, cause, .. } if cause.contains("timed out")),
        "{e}"
    );
}

/// The worker's one timer, moved from op to op, still fires for an op whose
/// deadline is earlier than that of the ops before it (a per-op timeout
/// shorter than the group's).
#[test]
fn a_short_timeout_after_longer_ones_still_fires() {
    let mut w = world(2, &small_opts());
    for _ in 0..3 {
        let works = w.iter_mut().map(|r| r.coll(Call::Barrier)).collect();
        wait_all(works);
    }
    let a = w[0].submit_at(
        1,
        Call::Recv {
            buf: HostBuffer::F32(vec![0.0; 4]),
            peer: 1,
        },
        Duration::from_millis(200),
    );
    let e = expect_err(a);
    assert!(matches!(e, WorkError::OpTimeout { .. }), "{e}");
}

/// A collective one rank calls and the other does not: the first times out;
/// the other, at its next op, sees the stray header (mismatch) or the first
/// rank's fault notice naming the timeout, never a hang or garbage.
#[test]
fn a_collective_the_peer_never_calls_times_out() {
    let mut w = world(2, &small_opts());
    w[0].seq += 1;
    let a = w[0].submit_at(
        w[0].seq,
        Call::AllReduce {
            buf: HostBuffer::F32(vec![1.0; 4]),
            op: ReduceOp::Sum,
        },
        Duration::from_millis(200),
    );
    let e = expect_err(a);
    assert!(matches!(e, WorkError::OpTimeout { .. }), "{e}");
    let b = w[1].coll(Call::Barrier);
    let e = expect_err(b);
    assert!(
        matches!(
            &e,
            WorkError::Remote { origin: 0, cause, .. } if cause.contains("timed out")
        ) || matches!(e, WorkError::Mismatch { .. }),
        "{e}"
    );
}

fn aborted(rank: usize) -> WorkError {
    WorkError::Aborted {
        ctx: OpContext {
            rank,
            group: "g".into(),
            seq: 0,
            op: "abort",
            internal: None,
        },
        reason: "test abort".into(),
    }
}

/// Ops already waiting on a peer fail with the peer's reason when it is
/// aborted (its fault notice), and the aborted rank's own queued and later
/// ops fail with the abort.
#[test]
fn aborted_peer_fails_pending_ops_with_its_reason() {
    let mut w = world(3, &tcp_opts());
    // Connected first (a barrier of 3 ranks connects every pair): an
    // aborted rank tells the peers it is connected to; one it never talked
    // to finds it gone (PeerLost) at its first op.
    let barriers: Vec<_> = w.iter_mut().map(|rk| rk.coll(Call::Barrier)).collect();
    for b in barriers {
        block_on(b).expect("barrier");
    }
    let buf = || HostBuffer::I64(vec![3; 1000]);
    let a = w[0].coll(Call::AllReduce {
        buf: buf(),
        op: ReduceOp::Sum,
    });
    let b = w[1].coll(Call::AllReduce {
        buf: buf(),
        op: ReduceOp::Sum,
    });
    w[2].be.abort(&aborted(2));
    let later = w[2].coll(Call::Barrier);
    let e = expect_err(later);
    assert!(matches!(e, WorkError::Aborted { .. }), "{e}");
    for e in [expect_err(a), expect_err(b)] {
        assert!(
            matches!(&e, WorkError::Remote { origin: 2, cause, .. } if cause.contains("test abort")),
            "{e}"
        );
    }
}

/// Ops waiting on a peer that dies (no word from it) fail with PeerLost
/// naming it.
#[test]
fn a_peer_that_dies_fails_pending_ops_with_peer_lost() {
    let mut w = world(3, &tcp_opts());
    let buf = || HostBuffer::I64(vec![3; 1000]);
    let a = w[0].coll(Call::AllReduce {
        buf: buf(),
        op: ReduceOp::Sum,
    });
    let b = w[1].coll(Call::AllReduce {
        buf: buf(),
        op: ReduceOp::Sum,
    });
    w[2].be.die(&aborted(2));
    for e in [expect_err(a), expect_err(b)] {
        assert!(matches!(e, WorkError::PeerLost { peer: 2, .. }), "{e}");
    }
}

/// A peer whose backend was dropped (goodbye) makes ops that need it fail
/// with PeerLeft naming it (not PeerLost: it did not die).
#[test]
fn dropped_peer_fails_later_ops_with_peer_left() {
    let mut w = world(3, &small_opts());
    // A first op that everyone completes.
    let works = w.iter_mut().map(|rk| rk.coll(Call::Barrier)).collect();
    wait_all(works);
    drop(w.pop());
    let works: Vec<_> = w
        .iter_mut()
        .map(|rk| {
            rk.coll(Call::AllReduce {
                buf: HostBuffer::F32(vec![1.0; 7]),
                op: ReduceOp::Sum,
            })
        })
        .collect();
    let mut left = 0;
    for wk in works {
        // A rank that failed on the departed peer first closes its own
        // connections without a goodbye: the other may see that.
        match expect_err(wk) {
            WorkError::PeerLeft { peer: 2, .. } => left += 1,
            WorkError::PeerLost { peer, .. } if peer != 2 => {}
            e => panic!("expected PeerLeft naming rank 2, got {e}"),
        }
    }
    assert!(left > 0);
}

/// Both ranks send a message larger than the socket buffers first, then
/// receive: no deadlock.
#[test]
fn both_sending_first_does_not_deadlock() {
    let mut w = world(2, &tcp_opts_default());
    let mut rng = StdRng::seed_from_u64(3);
    let big = 2 << 20;
    let data: Vec<HostBuffer> = (0..2)
        .map(|_| gen(&mut rng, DType::F32, big, ReduceOp::Sum))
        .collect();
    let mut works = Vec::new();
    for (r, rk) in w.iter_mut().enumerate() {
        let s = rk.p2p(Call::Send {
            buf: data[r].clone(),
            peer: 1 - r,
        });
        let v = rk.p2p(Call::Recv {
            buf: HostBuffer::zeros(DType::F32, big),
            peer: 1 - r,
        });
        works.push((s, v));
    }
    for (r, (s, v)) in works.into_iter().enumerate() {
        let (s, v) = block_on(futures::future::join(s, v));
        assert_eq!(s.unwrap()[0], data[r]);
        assert_eq!(v.unwrap()[0], data[1 - r]);
    }
}

/// Ops complete in submission order: when the last is done, every earlier
/// one is done too.
#[test]
fn ops_complete_in_submission_order() {
    let mut w = world(2, &small_opts());
    let mut all = Vec::new();
    for rk in w.iter_mut() {
        let v: Vec<_> = (0..40)
            .map(|i| {
                rk.coll(Call::AllReduce {
                    buf: HostBuffer::I32(vec![i; 1 + (i as usize % 3) * 600]),
                    op: ReduceOp::Sum,
                })
            })
            .collect();
        all.push(v);
    }
    for mut v in all {
        let last = v.pop().unwrap();
        let out = block_on(last).unwrap();
        // 39 % 3 == 0: the last op has one element.
        assert_eq!(out[0], HostBuffer::I32(vec![78]));
        assert!(v.iter().all(|wk| wk.is_done()), "an earlier op is not done");
    }
}

/// Rank `r`'s input to the `i`-th op of the caller-thread tests, and the
/// sum of both ranks' inputs.
fn pair_input(i: i64, r: i64) -> HostBuffer {
    HostBuffer::I64(vec![(i * 7919) % 1009 - 500 + r, r - i])
}

fn pair_sum(i: i64) -> HostBuffer {
    let v = 2 * ((i * 7919) % 1009 - 500) + 1;
    HostBuffer::I64(vec![v, 1 - 2 * i])
}

/// Two ranks on threads of their own, both at each small op together: the
/// awaiting caller runs it (reads the peer's frame, reduces, completes)
/// on its own thread, so the op is done when the caller's assist returns,
/// not later through chorus's I/O thread. A driver that did nothing would
/// leave every op pending at that point (the peer's frame needs a round
/// trip). Results are checked on every op.
#[test]
fn small_ops_complete_on_the_callers_thread() {
    let ops = 200;
    for (r, (inline, _)) in pair_in_lockstep(ops).iter().enumerate() {
        assert!(
            *inline >= ops as usize / 2,
            "rank {r}: only {inline} of {ops} ops were done when the caller's assist returned"
        );
    }
}

/// Runs `f(rank, its backend)` for every rank of `w` on a thread of its
/// own, all at once; the results in rank order.
fn on_rank_threads<T: Send>(w: Vec<Rank>, f: impl Fn(usize, Rank) -> T + Sync) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = w
            .into_iter()
            .enumerate()
            .map(|(r, rk)| s.spawn(move || f(r, rk)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Two ranks on threads of their own run `ops` small all_reduces, each
/// started on its submitter's thread and awaited through the driver (a
/// 200 ms spin); results checked. Per rank: the ops done when the
/// caller's assist returned, and the doorbells the rank rang.
fn pair_in_lockstep(ops: i64) -> Vec<(usize, u64)> {
    let opts = TcpOptions {
        caller_spin: Some(Duration::from_millis(200)),
        ..TcpOptions::default()
    };
    on_rank_threads(world(2, &opts), |r, mut rk| {
        let mut inline = 0;
        for i in 0..ops {
            let (work, assist) = rk.coll_assisted(Call::AllReduce {
                buf: pair_input(i, r as i64),
                op: ReduceOp::Sum,
            });
            let assist = assist.expect("a small op comes with the driver");
            assist.assist(&|| work.is_done(), None);
            inline += usize::from(work.is_done());
            let out = block_on(work).unwrap_or_else(|e| panic!("op {i}: {e}"));
            assert_eq!(out, vec![pair_sum(i)], "op {i} on rank {r}");
        }
        (inline, rk.be.doorbells())
    })
}

/// Two ranks at back-to-back small ops, each awaited by its caller: a
/// caller whose op is done leaves its pipes watched (see `linger`), so the
/// peer's frames for the next op ring almost no doorbell. A caller that
/// said "asleep" after each op would be rung for nearly every op.
#[test]
fn back_to_back_small_ops_ring_almost_no_doorbells() {
    let ops = 300;
    for (r, (_, rung)) in pair_in_lockstep(ops).iter().enumerate() {
        assert!(
            *rung < ops as u64 / 4,
            "rank {r} rang {rung} doorbells over {ops} back-to-back ops"
        );
    }
}

/// A caller that lingered after its op, then submits an op it never polls
/// nor waits for: the op's peer rings no doorbell, and the op completes
/// all the same — the sweep finds the worker on it and wakes the readers
/// (see `linger`).
#[test]
fn an_op_nobody_polls_after_a_lingering_caller_completes() {
    let opts = TcpOptions {
        caller_spin: Some(Duration::from_millis(200)),
        ..TcpOptions::default()
    };
    let mut w = world(2, &opts);
    let mut lingered = 0;
    for i in 0..10 {
        // Both ranks at op 2i together, each awaited by its caller.
        let done = on_rank_threads(w, |r, mut rk| {
            let (work, assist) = rk.coll_assisted(Call::AllReduce {
                buf: pair_input(2 * i, r as i64),
                op: ReduceOp::Sum,
            });
            assist.expect("driver").assist(&|| work.is_done(), None);
            let lingers = rk.be.lingers();
            assert_eq!(block_on(work).unwrap(), vec![pair_sum(2 * i)]);
            (rk, lingers)
        });
        lingered += usize::from(done[0].1);
        w = done.into_iter().map(|(rk, _)| rk).collect();
        // Rank 0 starts op 2i+1 on this thread and never polls it.
        let (idle, _) = w[0].coll_assisted(Call::AllReduce {
            buf: pair_input(2 * i + 1, 0),
            op: ReduceOp::Sum,
        });
        let (awaited, assist) = w[1].coll_assisted(Call::AllReduce {
            buf: pair_input(2 * i + 1, 1),
            op: ReduceOp::Sum,
        });
        assist.expect("driver").assist(&|| awaited.is_done(), None);
        assert_eq!(block_on(awaited).unwrap(), vec![pair_sum(2 * i + 1)]);
        let t = Instant::now();
        while !idle.is_done() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            idle.is_done(),
            "op {}: an op nobody polled did not complete",
            2 * i + 1
        );
        assert_eq!(block_on(idle).unwrap(), vec![pair_sum(2 * i + 1)]);
    }
    assert!(lingered > 0, "rank 0's caller never lingered after its op");
}

/// Rank `r`'s input of large op `i`, and every rank's sum of it.
fn large_input(i: i32, r: i32, count: usize) -> HostBuffer {
    HostBuffer::I32(
        (0..count)
            .map(|j| (j % 1000) as i32 * (r + 1) + i)
            .collect(),
    )
}

fn large_sum(i: i32, n: i32, count: usize) -> HostBuffer {
    let ranks = n * (n + 1) / 2;
    HostBuffer::I32(
        (0..count)
            .map(|j| (j % 1000) as i32 * ranks + n * i)
            .collect(),
    )
}

/// Where this host's ranks outnumber its cores, the caller that awaits a
/// large op drives it on its own thread for as long as its frames move
/// (`drive::LargeOp`). Two ranks, each at every 4 MiB op together: the op
/// is done when the caller's assist returns, though each takes longer
/// than the caller spin — the patience counts from the last frame, not
/// from the start. A driver that did nothing, or gave up after the spin,
/// would leave the ops pending at that point. Results are checked.
#[test]
fn large_ops_run_on_the_callers_thread_while_they_move() {
    let (ops, count) = (12, 1 << 20);
    let opts = TcpOptions {
        caller_spin: Some(Duration::from_micros(100)),
        ..TcpOptions::default()
    };
    let per_rank = on_rank_threads(world(2, &opts), |r, mut rk| {
        let (mut inline, mut longer) = (0, 0);
        for i in 0..ops {
            let work = rk.coll(Call::AllReduce {
                buf: large_input(i, r as i32, count),
                op: ReduceOp::Sum,
            });
            let t = Instant::now();
            rk.be.large_op_driver().assist(&|| work.is_done(), None);
            if work.is_done() {
                inline += 1;
                longer += usize::from(t.elapsed() > Duration::from_millis(1));
            }
            let out = block_on(work).unwrap_or_else(|e| panic!("op {i}: {e}"));
            assert_eq!(out, vec![large_sum(i, 2, count)], "op {i} on rank {r}");
        }
        (inline, longer)
    });
    for (r, (inline, longer)) in per_rank.into_iter().enumerate() {
        assert!(
            inline >= ops as usize / 2,
            "rank {r}: only {inline} of {ops} large ops were done when the caller's assist returned"
        );
        assert!(
            longer > 0,
            "rank {r}: no op took longer than 1 ms, so the test says nothing about the patience"
        );
    }
}

/// A caller driving a large op lets go at its deadline (that of
/// `Work::wait_timeout`) even while the op moves: with both ranks at a
/// 32 MiB op together (several milliseconds of copying), a 1 ms deadline
/// leaves the op pending when the assist returns; the I/O threads finish
/// it. A driver that ignored the deadline would return with the op done.
#[test]
fn a_driving_caller_lets_go_at_its_deadline() {
    let count = 8 << 20;
    let pending = on_rank_threads(world(2, &TcpOptions::default()), |r, mut rk| {
        let work = rk.coll(Call::AllReduce {
            buf: large_input(0, r as i32, count),
            op: ReduceOp::Sum,
        });
        let deadline = Instant::now() + Duration::from_millis(1);
        rk.be
            .large_op_driver()
            .assist(&|| work.is_done(), Some(deadline));
        let pending = !work.is_done();
        assert_eq!(block_on(work).unwrap(), vec![large_sum(0, 2, count)]);
        pending
    });
    for (r, pending) in pending.into_iter().enumerate() {
        assert!(
            pending,
            "rank {r}: the 32 MiB op was done when an assist with a 1 ms deadline returned"
        );
    }
}

/// A caller driving a large op whose peer comes late lets go once nothing
/// moved for its patience (`drive::LARGE_OP_PATIENCE`, 2 ms), not when the
/// op ends: the op is then finished by chorus's I/O threads.
#[test]
fn a_large_op_whose_peer_is_late_is_left_to_the_io_threads() {
    let count = 1 << 18;
    let mut w = world(2, &TcpOptions::default());
    let mut late = w.pop().unwrap();
    let mut early = w.pop().unwrap();
    for i in 0..3 {
        let work = early.coll(Call::AllReduce {
            buf: large_input(i, 0, count),
            op: ReduceOp::Sum,
        });
        let t = Instant::now();
        early.be.large_op_driver().assist(&|| work.is_done(), None);
        let held = t.elapsed();
        assert!(!work.is_done(), "done without its peer");
        assert!(
            held < Duration::from_millis(150),
            "the caller held on for {held:?} with nothing moving"
        );
        let peer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let work = late.coll(Call::AllReduce {
                buf: large_input(i, 1, count),
                op: ReduceOp::Sum,
            });
            assert_eq!(block_on(work).unwrap(), vec![large_sum(i, 2, count)]);
            late
        });
        assert_eq!(block_on(work).unwrap(), vec![large_sum(i, 2, count)]);
        late = peer.join().unwrap();
    }
}

/// A caller whose spin runs out before its peer comes lets go: the op is
/// finished by chorus's I/O threads once the peer arrives (the sockets the
/// spin took out of the I/O driver are back in it), again and again.
#[test]
fn a_spin_that_gives_up_hands_the_op_to_the_io_threads() {
    let opts = TcpOptions {
        caller_spin: Some(Duration::from_millis(2)),
        ..TcpOptions::default()
    };
    let mut w = world(2, &opts);
    let mut late = w.pop().unwrap();
    let mut early = w.pop().unwrap();
    for i in 0..3 {
        let (work, assist) = early.coll_assisted(Call::AllReduce {
            buf: pair_input(i, 0),
            op: ReduceOp::Sum,
        });
        assist.expect("driver").assist(&|| work.is_done(), None);
        assert!(!work.is_done(), "done without its peer");
        let peer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let (work, _) = late.coll_assisted(Call::AllReduce {
                buf: pair_input(i, 1),
                op: ReduceOp::Sum,
            });
            assert_eq!(block_on(work).unwrap(), vec![pair_sum(i)]);
            late
        });
        assert_eq!(block_on(work).unwrap(), vec![pair_sum(i)]);
        late = peer.join().unwrap();
    }
}

/// A small op started on the submitting thread whose caller never polls
/// nor waits: it completes all the same (chorus's I/O threads take over
/// from the submit), and so does the next one.
#[test]
fn a_caller_that_stops_polling_stops_nothing() {
    let mut w = world(2, &TcpOptions::default());
    for i in 0..2 {
        let (idle, _) = w[0].coll_assisted(Call::AllReduce {
            buf: pair_input(i, 0),
            op: ReduceOp::Sum,
        });
        let (awaited, _) = w[1].coll_assisted(Call::AllReduce {
            buf: pair_input(i, 1),
            op: ReduceOp::Sum,
        });
        assert_eq!(block_on(awaited).unwrap(), vec![pair_sum(i)]);
        let t = Instant::now();
        while !idle.is_done() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(idle.is_done(), "an op nobody polled did not complete");
        assert_eq!(block_on(idle).unwrap(), vec![pair_sum(i)]);
    }
}

#[test]
fn bad_setup_arguments_are_errors() {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let r = block_on(TcpBackend::connect(
        store.clone(),
        2,
        2,
        "g".into(),
        TcpOptions::default(),
        false,
    ));
    assert!(matches!(r, Err(crate::Error::InvalidArgument(_))));
    let opts = TcpOptions {
        chunk_bytes: 0,
        ..TcpOptions::default()
    };
    let r = block_on(TcpBackend::connect(
        store.clone(),
        0,
        2,
        "g".into(),
        opts,
        false,
    ));
    assert!(matches!(r, Err(crate::Error::InvalidArgument(_))));
    // A peer that never shows up: setup only publishes this rank's
    // address, and the first op that needs the peer fails, naming its
    // address key.
    let opts = TcpOptions {
        connect_timeout: Duration::from_millis(200),
        ..TcpOptions::default()
    };
    let be = block_on(TcpBackend::connect(store, 0, 2, "g".into(), opts, false))
        .expect("setup waits for no peer");
    let mut rk = Rank::of(be);
    let start = Instant::now();
    let e = expect_err(rk.coll(Call::Barrier));
    assert!(
        matches!(&e, WorkError::Store { cause, .. } if cause.contains("addr/1") && cause.contains("rank 1")),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(5), "{e}");
}

#[test]
fn different_options_are_refused_at_setup() {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let a = TcpOptions {
        connect_timeout: Duration::from_secs(2),
        ..small_opts()
    };
    let b = TcpOptions {
        chunk_bytes: 1024,
        ..a.clone()
    };
    let (ra, rb) = block_on(futures::future::join(
        TcpBackend::connect(store.clone(), 0, 2, "g".into(), a, false),
        TcpBackend::connect(store, 1, 2, "g".into(), b, false),
    ));
    // Setup connects to no one; the first op's handshake refuses.
    let mut w = [ra, rb].map(|r| Rank::of(r.expect("setup")));
    let works = w
        .iter_mut()
        .map(|rk| rk.coll(Call::Barrier))
        .collect::<Vec<_>>();
    for work in works {
        let e = expect_err(work);
        assert!(
            e.to_string().contains("same TcpOptions") || matches!(e, WorkError::PeerLost { .. }),
            "{e}"
        );
    }
}

#[test]
fn a_liveness_timeout_below_a_second_is_refused_and_zero_turns_it_off() {
    let store: Arc<dyn Store> = Arc::new(chorus_store::InMemoryStore::default());
    let opts = TcpOptions {
        liveness_timeout: Duration::from_millis(500),
        ..TcpOptions::default()
    };
    let r = block_on(TcpBackend::connect(store, 0, 1, "live".into(), opts, false));
    let e = r.expect_err("500 ms must be refused").to_string();
    assert!(
        e.contains("liveness_timeout") && e.contains("at least 1 s"),
        "{e}"
    );
    // Off, and the smallest allowed: both connect (a world of one).
    for live in [Duration::ZERO, Duration::from_secs(1)] {
        let store: Arc<dyn Store> = Arc::new(chorus_store::InMemoryStore::default());
        let opts = TcpOptions {
            liveness_timeout: live,
            ..tcp_opts()
        };
        block_on(TcpBackend::connect(store, 0, 1, "live".into(), opts, false)).expect("connects");
    }
}

#[test]
fn a_timed_out_read_is_a_silent_link_and_other_errors_a_broken_one() {
    use super::conn::read_failed;
    use super::state::PeerState;
    let live = Duration::from_secs(7);
    // What the kernel's ETIMEDOUT reads as.
    let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
    assert!(matches!(read_failed(&timed_out, live), PeerState::Silent(d) if d == live));
    // Without a liveness timeout a timeout is no statement about the link.
    assert!(matches!(
        read_failed(&timed_out, Duration::ZERO),
        PeerState::Lost(_)
    ));
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert!(matches!(read_failed(&reset, live), PeerState::Lost(_)));
    // The op's error names the peer and the timeout.
    let ctx = OpContext {
        rank: 0,
        group: "g".into(),
        seq: 4,
        op: "all_reduce",
        internal: None,
    };
    let e = PeerState::Silent(live).error(&ctx, 3);
    assert!(matches!(&e, WorkError::PeerSilent { peer: 3, after, .. } if *after == live));
    let msg = e.to_string();
    assert!(
        msg.contains("rank 3") && msg.contains("went silent") && msg.contains("7s"),
        "{msg}"
    );
}

/// Every op through the logarithmic algorithms and the ring, 1 to 17
/// ranks, a few dtypes, sizes on both sides of the crossover, against
/// serial references.
#[test]
fn every_op_matches_reference_from_1_to_17_ranks() {
    let mut rng = StdRng::seed_from_u64(0x17);
    for n in 1..=17 {
        let opts = TcpOptions {
            local_unix_sockets: n % 3 != 0,
            ..small_opts()
        };
        let mut w = world(n, &opts);
        for (di, dtype) in [DType::F32, DType::I64, DType::BF16]
            .into_iter()
            .enumerate()
        {
            let es = dtype.size();
            let x = opts.crossover_bytes / es;
            // all_reduce, broadcast and reduce choose by their buffer;
            // all_gather and reduce_scatter by n times it.
            let sizes = [1, x - 1, x, (x / n).max(1) + 1];
            for (si, len) in sizes.into_iter().enumerate() {
                check_batch(&mut w, &mut rng, dtype, len, di * 7 + si + n);
            }
        }
    }
}

/// Board ops of every rank of `w`, `rounds` times (more ops than the
/// board's two slots): all_reduce, broadcast and reduce of `len` i32s and
/// a barrier, against their expected results.
fn run_board_ops(w: &mut [Rank], rounds: usize, len: usize) {
    let n = w.len() as i32;
    for round in 0..rounds {
        let (root_b, root_r) = ((round * 5) % w.len(), (round * 7 + 3) % w.len());
        let works: Vec<Vec<_>> = w
            .iter_mut()
            .enumerate()
            .map(|(r, rk)| {
                let r = r as i32;
                vec![
                    rk.coll(Call::AllReduce {
                        buf: HostBuffer::I32((0..len as i32).map(|i| r * i + 1).collect()),
                        op: ReduceOp::Sum,
                    }),
                    rk.coll(Call::Broadcast {
                        buf: HostBuffer::I32(vec![r + 100; len]),
                        root: root_b,
                    }),
                    rk.coll(Call::Reduce {
                        buf: HostBuffer::I32(vec![r; len]),
                        root: root_r,
                        op: ReduceOp::Max,
                    }),
                    rk.coll(Call::Barrier),
                ]
            })
            .collect();
        for (r, ops) in works.into_iter().enumerate() {
            let out: Vec<_> = ops
                .into_iter()
                .map(|o| block_on(o).expect("op failed"))
                .collect();
            let sum: Vec<i32> = (0..len as i32).map(|i| i * n * (n - 1) / 2 + n).collect();
            assert_eq!(out[0][0], HostBuffer::I32(sum), "all_reduce, rank {r}");
            assert_eq!(
                out[1][0],
                HostBuffer::I32(vec![root_b as i32 + 100; len]),
                "broadcast, rank {r}"
            );
            if r == root_r {
                assert_eq!(out[2][0], HostBuffer::I32(vec![n - 1; len]), "reduce");
            }
        }
    }
}

/// A group of more than 8 ranks on one host runs its small all_reduce,
/// broadcast, reduce and barrier on its shared-memory board: right results
/// up to the board's 4 KiB a rank, and no connection made.
#[test]
fn small_ops_of_a_group_on_one_host_run_on_its_board() {
    let mut w = world(12, &TcpOptions::default());
    for len in [0, 1, 37, 1024] {
        run_board_ops(&mut w, 3, len);
    }
    for rk in &w {
        assert_eq!(rk.be.connections(), 0, "rank {}", rk.rank());
    }
    if cfg!(target_os = "linux") {
        assert!(std::fs::read_to_string("/proc/self/maps")
            .is_ok_and(|m| m.contains("chorus-tcp-board")));
    }
    // Larger than the board: recursive doubling, over connections.
    run_board_ops(&mut w, 1, 1025);
    assert!(w.iter().all(|rk| rk.be.connections() > 0));
    assert_no_shm_files();
}

/// One rank without shared memory votes the board down for the whole
/// group, whose small ops then exchange frames.
#[test]
fn one_rank_without_shared_memory_turns_the_board_off() {
    let mut opts = vec![TcpOptions::default(); 10];
    opts[6].shared_memory = false;
    let mut w = world_with(&opts);
    run_board_ops(&mut w, 2, 5);
    for rk in &w {
        assert!(rk.be.connections() > 0, "rank {}", rk.rank());
    }
}

/// Setup connects to no one; the first op connects only the peers its
/// algorithm needs (a 4-byte all_reduce of 16 ranks: 4 partners each).
#[test]
fn connections_are_made_on_first_use_only() {
    let no_board = TcpOptions {
        shared_memory: false,
        ..small_opts()
    };
    for opts in [no_board, tcp_opts()] {
        let mut w = world(16, &opts);
        assert!(w.iter().all(|rk| rk.be.connections() == 0));
        let works = w
            .iter_mut()
            .enumerate()
            .map(|(r, rk)| {
                rk.coll(Call::AllReduce {
                    buf: HostBuffer::I32(vec![r as i32]),
                    op: ReduceOp::Sum,
                })
            })
            .collect();
        for o in wait_all(works) {
            assert_eq!(o[0], HostBuffer::I32(vec![120]));
        }
        for rk in &w {
            assert_eq!(rk.be.connections(), 4, "rank {}", rk.rank());
        }
        // The barrier (dissemination: ranks 1, 2, 4 and 8 away on either
        // side) adds the three it had not met.
        let works = w.iter_mut().map(|rk| rk.coll(Call::Barrier)).collect();
        wait_all(works);
        for rk in &w {
            assert_eq!(rk.be.connections(), 7, "rank {}", rk.rank());
        }
    }
    assert_no_shm_files();
}

/// Two ranks that dial each other at once end with one connection, and
/// their ops work.
#[test]
fn ranks_that_dial_each_other_at_once_keep_one_connection() {
    for round in 0..20 {
        let opts = if round % 2 == 0 {
            small_opts()
        } else {
            tcp_opts()
        };
        let mut w = world(2, &opts);
        for _ in 0..3 {
            let works = w
                .iter_mut()
                .map(|rk| {
                    rk.coll(Call::AllReduce {
                        buf: HostBuffer::I64(vec![1; 3]),
                        op: ReduceOp::Sum,
                    })
                })
                .collect();
            for o in wait_all(works) {
                assert_eq!(o[0], HostBuffer::I64(vec![2; 3]));
            }
        }
        for rk in &w {
            assert_eq!(rk.be.connections(), 1, "round {round} rank {}", rk.rank());
        }
    }
}

/// A peer that published an address but never answers there: the op that
/// needs it fails within the connect timeout, naming it.
#[test]
fn a_peer_that_never_answers_fails_the_op_naming_it() {
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    // Accepts connections (the kernel's backlog) but never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    block_on(store.set("addr/1", addr.to_string().as_bytes())).expect("set");
    let opts = TcpOptions {
        connect_timeout: Duration::from_millis(300),
        ..TcpOptions::default()
    };
    let be = block_on(TcpBackend::connect(store, 0, 2, "g".into(), opts, false)).expect("setup");
    let mut rk = Rank::of(be);
    let start = Instant::now();
    let e = expect_err(rk.coll(Call::AllReduce {
        buf: HostBuffer::F32(vec![1.0]),
        op: ReduceOp::Sum,
    }));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let ctx = e.context();
    assert_eq!((ctx.rank, ctx.seq, ctx.op), (0, 1, "all_reduce"), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("cannot connect to rank 1") && msg.contains("connect_timeout"),
        "{msg}"
    );
    drop(silent);
}

/// A mismatch among more ranks than the direct algorithms serve (trees,
/// doubling, dissemination; or the group's board): every rank fails the
/// op or its next with the mismatch, whatever rank is odd.
#[test]
fn mismatches_through_the_logarithmic_algorithms_and_the_board_fail_every_rank() {
    let n = 11;
    let board = small_opts();
    let bcast = |root| Call::Broadcast {
        buf: HostBuffer::F32(vec![1.0; 6]),
        root,
    };
    let reduce = |root| Call::Reduce {
        buf: HostBuffer::F32(vec![1.0; 6]),
        root,
        op: ReduceOp::Sum,
    };
    let all_reduce = |len| Call::AllReduce {
        buf: HostBuffer::F32(vec![1.0; len]),
        op: ReduceOp::Sum,
    };
    type Case = (&'static str, Box<dyn Fn(bool) -> Call>);
    let cases: Vec<Case> = vec![
        (
            "broadcast root",
            Box::new(move |odd| bcast(if odd { 3 } else { 5 })),
        ),
        (
            "reduce root",
            Box::new(move |odd| reduce(if odd { 3 } else { 5 })),
        ),
        (
            "all_reduce count",
            Box::new(move |odd| all_reduce(if odd { 7 } else { 6 })),
        ),
        (
            "op",
            Box::new(move |odd| if odd { all_reduce(6) } else { bcast(5) }),
        ),
        (
            "barrier for all_reduce",
            Box::new(move |odd| if odd { Call::Barrier } else { all_reduce(6) }),
        ),
        (
            // On the board the others; the odd rank runs the ring.
            "all_reduce count across the crossover",
            Box::new(move |odd| all_reduce(if odd { 600 } else { 6 })),
        ),
    ];
    // Frames (trees, doubling, dissemination), then the group's board.
    let no_board = TcpOptions {
        shared_memory: false,
        ..small_opts()
    };
    for (name, call) in &cases {
        for (opts, odd) in [(&no_board, 0), (&no_board, 5), (&no_board, 9)]
            .into_iter()
            .chain([0, 5, 9].map(|odd| (&board, odd)))
        {
            let mut w = world(n, opts);
            let works: Vec<_> = w
                .iter_mut()
                .enumerate()
                .map(|(r, rk)| (rk.coll(call(r == odd)), rk.coll(Call::Barrier)))
                .collect();
            for (r, (op, next)) in works.into_iter().enumerate() {
                let e = match (block_on(op), block_on(next)) {
                    (Err(f), _) | (Ok(_), Err(f)) => f.error,
                    (Ok(_), Ok(_)) => {
                        panic!("{name}, odd rank {odd}: rank {r} took a mismatched op")
                    }
                };
                assert!(
                    matches!(e, WorkError::Mismatch { .. }),
                    "{name}, odd rank {odd}: rank {r}: {e}"
                );
            }
        }
    }
}
