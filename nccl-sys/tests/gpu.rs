//! NCCL on a real GPU (1 rank per GPU). Ignored by default; run on the GPU
//! machine with `--include-ignored`. Each test FAILS when there is no GPU or
//! no NCCL, it never skips.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use nccl_sys::sys::*;
use nccl_sys::{nccl, Candidate, Nccl, SearchPlan, MIN_VERSION};
use rand::{Rng, SeedableRng};

fn cuda() -> (Arc<CudaContext>, Arc<CudaStream>) {
    // SAFETY: only probes whether the driver library can be opened.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    assert!(
        present,
        "no CUDA driver library: this test needs a CUDA GPU"
    );
    let ctx = CudaContext::new(0).expect("CUDA device 0: this test needs a CUDA GPU");
    let stream = ctx.new_stream().expect("create stream");
    (ctx, stream)
}

fn lib() -> &'static Nccl {
    match nccl() {
        Ok(n) => n,
        Err(e) => panic!("NCCL must load on the GPU machine: {e}"),
    }
}

fn raw(stream: &CudaStream) -> cudaStream_t {
    stream.cu_stream() as cudaStream_t
}

/// A communicator that is destroyed when dropped.
struct Comm {
    nccl: &'static Nccl,
    comm: ncclComm_t,
}

impl Comm {
    fn one_rank(nccl: &'static Nccl) -> Self {
        let mut id = ncclUniqueId::zeroed();
        // SAFETY: `id` is a valid ncclUniqueId to write to.
        nccl.check(unsafe { (nccl.ncclGetUniqueId)(&mut id) })
            .expect("ncclGetUniqueId");
        assert_ne!(
            id,
            ncclUniqueId::zeroed(),
            "ncclGetUniqueId left the id zeroed"
        );
        let mut comm: ncclComm_t = null_mut();
        // SAFETY: `comm` is writable; 1 rank, rank 0, id from ncclGetUniqueId;
        // the CUDA context of device 0 is current on this thread.
        nccl.check(unsafe { (nccl.ncclCommInitRank)(&mut comm, 1, id, 0) })
            .expect("ncclCommInitRank");
        assert!(!comm.is_null());
        Comm { nccl, comm }
    }

    fn query(&self) -> (i32, i32, i32) {
        let (mut rank, mut count, mut dev) = (-1, -1, -1);
        // SAFETY: `self.comm` is a live communicator and the outputs are
        // writable ints.
        unsafe {
            self.nccl
                .check((self.nccl.ncclCommUserRank)(self.comm, &mut rank))
                .unwrap();
            self.nccl
                .check((self.nccl.ncclCommCount)(self.comm, &mut count))
                .unwrap();
            self.nccl
                .check((self.nccl.ncclCommCuDevice)(self.comm, &mut dev))
                .unwrap();
        }
        (rank, count, dev)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and no longer used; every op on it
        // was synchronized by the tests before this point.
        let rc = unsafe { (self.nccl.ncclCommDestroy)(self.comm) };
        if !std::thread::panicking() {
            self.nccl.check(rc).expect("ncclCommDestroy");
        }
    }
}

/// Runs `op(send_ptr, recv_ptr)` on `stream` and returns the receive buffer
/// on the host. The receive buffer is poisoned first.
fn run_op<T: DeviceRepr + Copy + Default>(
    stream: &Arc<CudaStream>,
    input: &[T],
    out_len: usize,
    poison: T,
    op: impl FnOnce(*const c_void, *mut c_void) -> ncclResult_t,
) -> Vec<T> {
    let send: CudaSlice<T> = stream.clone_htod(input).unwrap();
    let mut recv: CudaSlice<T> = stream.clone_htod(&vec![poison; out_len]).unwrap();
    {
        let (sp, _s) = send.device_ptr(stream);
        let (rp, _r) = recv.device_ptr_mut(stream);
        lib()
            .check(op(sp as *const c_void, rp as *mut c_void))
            .expect("NCCL op");
    }
    stream.clone_dtoh(&recv).unwrap()
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1000.0f32..1000.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_nccl_loads_and_reports_its_version() {
    let nccl = lib();
    println!(
        "nccl(): NCCL {} from {} (missing optional: {:?})",
        nccl.version(),
        nccl.path(),
        nccl.missing_optional()
    );
    assert!(nccl.version() >= MIN_VERSION);
    // Every NCCL >= 2.18 has the optional symbols of 2.18; the
    // fault-tolerance calls came later (shrink 2.27, revoke 2.28.7, grow
    // 2.29) and are used where present.
    let later = [
        "ncclCommShrink",
        "ncclCommRevoke",
        "ncclCommGetUniqueId",
        "ncclCommGrow",
    ];
    let missing: Vec<_> = nccl
        .missing_optional()
        .into_iter()
        .filter(|s| !later.contains(s))
        .collect();
    assert!(
        missing.is_empty(),
        "a real NCCL >= 2.18 has every symbol of 2.18, but {missing:?} are missing"
    );
    assert!(nccl.error_string(ncclResult_t::ncclSystemError).len() > 5);
    // Every other copy the default search can see, e.g. the pip package.
    for c in SearchPlan::from_env().candidates {
        if let Candidate::Path(p) = &c {
            if p.exists() {
                match Nccl::load_from(p) {
                    Ok(n) => println!("also found: NCCL {} at {}", n.version(), n.path()),
                    Err(e) => println!("also found but unusable: {e}"),
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_one_rank_all_reduce_sum_f32_is_identity() {
    let (_ctx, stream) = cuda();
    let nccl = lib();
    let comm = Comm::one_rank(nccl);
    assert_eq!(comm.query(), (0, 1, 0));
    let n = (1 << 20) + 3;
    let input = random_f32(n, 1);
    let out = run_op(&stream, &input, n, f32::NAN, |s, r| {
        // SAFETY: s and r are device buffers of n f32 on device 0; the stream
        // belongs to device 0's primary context like the communicator.
        unsafe {
            (nccl.ncclAllReduce)(
                s,
                r,
                n,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                comm.comm,
                raw(&stream),
            )
        }
    });
    assert_eq!(
        bits(&out),
        bits(&input),
        "1-rank all_reduce must be identity"
    );
    println!("all_reduce of {n} f32 on 1 rank: identity as expected");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_one_rank_all_reduce_every_dtype_is_identity() {
    let (_ctx, stream) = cuda();
    let nccl = lib();
    let comm = Comm::one_rank(nccl);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let n = 4099;
    let all_reduce = |dtype: ncclDataType_t| {
        let comm = comm.comm;
        let stream = raw(&stream);
        move |s: *const c_void, r: *mut c_void| {
            // SAFETY: s and r hold n elements of `dtype` on device 0.
            unsafe { (nccl.ncclAllReduce)(s, r, n, dtype, ncclRedOp_t::ncclSum, comm, stream) }
        }
    };
    let i8s: Vec<i8> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(&stream, &i8s, n, 0x55, all_reduce(ncclDataType_t::ncclInt8)),
        i8s
    );
    let u8s: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(
            &stream,
            &u8s,
            n,
            0x55,
            all_reduce(ncclDataType_t::ncclUint8)
        ),
        u8s
    );
    let i32s: Vec<i32> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(&stream, &i32s, n, -7, all_reduce(ncclDataType_t::ncclInt32)),
        i32s
    );
    let u32s: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(&stream, &u32s, n, 7, all_reduce(ncclDataType_t::ncclUint32)),
        u32s
    );
    let i64s: Vec<i64> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(&stream, &i64s, n, -7, all_reduce(ncclDataType_t::ncclInt64)),
        i64s
    );
    let u64s: Vec<u64> = (0..n).map(|_| rng.gen()).collect();
    assert_eq!(
        run_op(&stream, &u64s, n, 7, all_reduce(ncclDataType_t::ncclUint64)),
        u64s
    );
    let f64s: Vec<f64> = (0..n).map(|_| rng.gen_range(-1e9..1e9)).collect();
    let out = run_op(
        &stream,
        &f64s,
        n,
        f64::NAN,
        all_reduce(ncclDataType_t::ncclFloat64),
    );
    assert!(out
        .iter()
        .zip(&f64s)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // Half types as bit patterns of finite values.
    let f16s: Vec<u16> = (0..n)
        .map(|_| (rng.gen::<u16>() & 0x83ff) | (rng.gen_range(1u16..=29) << 10))
        .collect();
    assert_eq!(
        run_op(
            &stream,
            &f16s,
            n,
            0x7e00,
            all_reduce(ncclDataType_t::ncclFloat16)
        ),
        f16s
    );
    let bf16s: Vec<u16> = random_f32(n, 3)
        .iter()
        .map(|x| (x.to_bits() >> 16) as u16)
        .collect();
    assert_eq!(
        run_op(
            &stream,
            &bf16s,
            n,
            0x7fc0,
            all_reduce(ncclDataType_t::ncclBfloat16)
        ),
        bf16s
    );
    println!(
        "all_reduce identity on 1 rank for i8 u8 i32 u32 i64 u64 f64 f16 bf16 ({n} elements each)"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_one_rank_every_op_f32_is_identity() {
    let (_ctx, stream) = cuda();
    let nccl = lib();
    let comm = Comm::one_rank(nccl);
    let c = comm.comm;
    let st = raw(&stream);
    let n = 65_537;
    let input = random_f32(n, 4);
    let f32t = ncclDataType_t::ncclFloat32;
    // In every op below, s and r hold n f32 on device 0, and the
    // communicator and the stream live on device 0.
    // SAFETY: buffers, communicator and stream as described above.
    let broadcast = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        (nccl.ncclBroadcast)(s, r, n, f32t, 0, c, st)
    });
    assert_eq!(bits(&broadcast), bits(&input), "broadcast");
    // SAFETY: buffers, communicator and stream as described above.
    let reduce = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        (nccl.ncclReduce)(s, r, n, f32t, ncclRedOp_t::ncclMax, 0, c, st)
    });
    assert_eq!(bits(&reduce), bits(&input), "reduce");
    // SAFETY: buffers, communicator and stream as described above.
    let gather = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        (nccl.ncclAllGather)(s, r, n, f32t, c, st)
    });
    assert_eq!(bits(&gather), bits(&input), "all_gather");
    // SAFETY: buffers, communicator and stream as described above.
    let scatter = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        (nccl.ncclReduceScatter)(s, r, n, f32t, ncclRedOp_t::ncclSum, c, st)
    });
    assert_eq!(bits(&scatter), bits(&input), "reduce_scatter");
    // SAFETY: buffers, communicator and stream as described above.
    let avg = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        (nccl.ncclAllReduce)(s, r, n, f32t, ncclRedOp_t::ncclAvg, c, st)
    });
    assert_eq!(bits(&avg), bits(&input), "all_reduce avg over 1 rank");
    // SAFETY: buffers, communicator and stream as described above.
    let p2p = run_op(&stream, &input, n, f32::NAN, |s, r| unsafe {
        // Send to and receive from oneself, fused in one group.
        let rc = (nccl.ncclGroupStart)();
        if !rc.is_success() {
            return rc;
        }
        let a = (nccl.ncclSend)(s, n, f32t, 0, c, st);
        let b = (nccl.ncclRecv)(r, n, f32t, 0, c, st);
        let end = (nccl.ncclGroupEnd)();
        [a, b, end]
            .into_iter()
            .find(|rc| !rc.is_success())
            .unwrap_or(end)
    });
    assert_eq!(bits(&p2p), bits(&input), "send/recv to self");
    println!("broadcast, reduce, all_gather, reduce_scatter, avg, send/recv: identity on 1 rank");
}

/// Polls `ncclCommGetAsyncError` until the communicator leaves
/// `ncclInProgress`, for at most a minute.
fn wait_ready(nccl: &Nccl, comm: ncclComm_t) -> (ncclResult_t, u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut polls = 0;
    loop {
        let mut state = ncclResult_t::ncclInProgress;
        // SAFETY: `comm` was returned by a non-blocking init/split and
        // `state` is writable.
        nccl.check(unsafe { (nccl.ncclCommGetAsyncError)(comm, &mut state) })
            .expect("ncclCommGetAsyncError");
        polls += 1;
        if !state.is_in_progress() {
            return (state, polls);
        }
        assert!(
            Instant::now() < deadline,
            "communicator still in progress after 60 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_nonblocking_config_init_split_finalize() {
    let (_ctx, stream) = cuda();
    let nccl = lib();
    let init = nccl.ncclCommInitRankConfig.expect("ncclCommInitRankConfig");
    let split = nccl.ncclCommSplit.expect("ncclCommSplit");
    let finalize = nccl.ncclCommFinalize.expect("ncclCommFinalize");

    let mut id = ncclUniqueId::zeroed();
    // SAFETY: `id` is writable.
    nccl.check(unsafe { (nccl.ncclGetUniqueId)(&mut id) })
        .unwrap();
    let name = c"chorus-test";
    let mut config = ncclConfig_t {
        blocking: 0,
        commName: name.as_ptr(),
        ..ncclConfig_t::initializer()
    };
    let mut comm: ncclComm_t = null_mut();
    // SAFETY: outputs writable, config built by the initializer and alive
    // for the call; device 0's context is current.
    let rc = unsafe { init(&mut comm, 1, id, 0, &mut config) };
    assert!(rc.is_success() || rc.is_in_progress(), "init: {}", rc);
    let (state, polls) = wait_ready(nccl, comm);
    nccl.check(state).expect("non-blocking init");
    println!("non-blocking init ready after {polls} polls (first rc {rc})");
    let owner = Comm { nccl, comm };
    assert_eq!(owner.query(), (0, 1, 0));

    // Split into one colour; the child inherits the non-blocking config.
    let mut child: ncclComm_t = null_mut();
    // SAFETY: parent live and ready; `child` writable; null config = inherit.
    let rc = unsafe { split(owner.comm, 0, 0, &mut child, std::ptr::null_mut()) };
    assert!(rc.is_success() || rc.is_in_progress(), "split: {}", rc);
    // A non-blocking split runs as a job of the PARENT: NCCL keeps the
    // address of `child` and writes the new communicator there only when
    // the job completes, which polling the parent's async error drives.
    // (`child` must therefore stay at a fixed address until then.)
    let (state, polls) = wait_ready(nccl, owner.comm);
    nccl.check(state).expect("split (parent state)");
    assert!(!child.is_null(), "split finished but wrote no communicator");
    let (state, _) = wait_ready(nccl, child);
    nccl.check(state).expect("split (child state)");
    println!("non-blocking split: first rc {rc}, parent ready after {polls} polls");
    let child = Comm { nccl, comm: child };
    assert_eq!(child.query(), (0, 1, 0));

    // The child works: all_reduce on it.
    let n = 1000;
    let input = random_f32(n, 5);
    let c = child.comm;
    let st = raw(&stream);
    let out = run_op(&stream, &input, n, f32::NAN, |s, r| {
        // SAFETY: device buffers of n f32 on device 0.
        let rc = unsafe {
            (nccl.ncclAllReduce)(
                s,
                r,
                n,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                c,
                st,
            )
        };
        // On a non-blocking communicator the op may still be being enqueued:
        // wait for that before the stream is synchronized.
        if rc.is_in_progress() {
            wait_ready(nccl, c).0
        } else {
            rc
        }
    });
    assert_eq!(
        bits(&out),
        bits(&input),
        "all_reduce on the split communicator"
    );

    // A colour of NCCL_SPLIT_NOCOLOR yields no communicator.
    let mut none: ncclComm_t = null_mut();
    // SAFETY: as above.
    let rc = unsafe {
        split(
            owner.comm,
            NCCL_SPLIT_NOCOLOR,
            0,
            &mut none,
            std::ptr::null_mut(),
        )
    };
    assert!(
        rc.is_success() || rc.is_in_progress(),
        "nocolor split: {}",
        rc
    );
    if rc.is_in_progress() {
        let (state, _) = wait_ready(nccl, owner.comm);
        nccl.check(state).unwrap();
    }
    assert!(none.is_null(), "NOCOLOR must give no communicator");

    // Finalize both (non-blocking: poll), then destroy (by drop). A call
    // that returned success may still leave the communicator's state in
    // progress for a moment: every communicator is ready first.
    for (name, comm) in [("child", child.comm), ("parent", owner.comm)] {
        let (state, _) = wait_ready(nccl, comm);
        nccl.check(state)
            .unwrap_or_else(|e| panic!("{name} before finalize: {e}"));
        // SAFETY: live communicators, all their work synchronized above.
        let rc = unsafe { finalize(comm) };
        assert!(
            rc.is_success() || rc.is_in_progress(),
            "{name} finalize: {}",
            rc
        );
        let (state, _) = wait_ready(nccl, comm);
        nccl.check(state)
            .unwrap_or_else(|e| panic!("{name} finalize: {e}"));
    }
    println!("config init (blocking=0, commName), split, NOCOLOR split, finalize: ok");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_check_reports_real_errors() {
    let (_ctx, _stream) = cuda();
    let nccl = lib();
    // An invalid rank is refused with ncclInvalidArgument and words.
    let mut id = ncclUniqueId::zeroed();
    // SAFETY: `id` is writable.
    nccl.check(unsafe { (nccl.ncclGetUniqueId)(&mut id) })
        .unwrap();
    let mut comm: ncclComm_t = null_mut();
    // SAFETY: outputs writable; rank 5 of 1 is invalid and NCCL rejects it
    // before creating anything.
    let rc = unsafe { (nccl.ncclCommInitRank)(&mut comm, 1, id, 5) };
    let err = nccl.check(rc).unwrap_err();
    assert_eq!(err.code, ncclResult_t::ncclInvalidArgument);
    println!("typed NCCL error: {err}");
    assert!(err.to_string().contains("ncclInvalidArgument (code 4)"));
}
