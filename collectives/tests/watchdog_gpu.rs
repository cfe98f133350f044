//! The watchdog on a GPU: a spin kernel holds the
//! stream an all_reduce waits on for longer than the op timeout; the
//! watchdog (not a blocking wait) must fail the awaited work with
//! `OpTimeout` within timeout + 100 ms, abort the group's NCCL communicator,
//! and leave the process able to create a new group and run ops on it.
//!
//! Ignored by default; run on the GPU machine with `--include-ignored
//! --test-threads=1`. Fails when no GPU is found.
#![forbid(unsafe_code)]

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chorus::test_util::reference_reduce;
use chorus::test_util::{one_rank_group, Kernels};
use chorus::watchdog;
use chorus::{Device, Stream, StreamPriority};
use chorus::{DeviceBuffer, ProcessGroup, ReduceOp, WorkError};
use chorus_core::sync::lock;
use futures::executor::block_on;
use rand::{Rng, SeedableRng};

/// Everything the tracing subscriber writes, to find the abort event.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&LOG).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&lock(&LOG)).into_owned()
}

fn device_group(name: &str) -> ProcessGroup {
    one_rank_group(name, 0).unwrap_or_else(|e| panic!("group {name}: {e}"))
}

fn upload(s: &Stream, v: &[f32]) -> DeviceBuffer<f32> {
    DeviceBuffer::new(s.clone_htod(v).unwrap()).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_watchdog_times_out_a_spinning_stream_then_a_new_group_works() {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| LogWriter)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
    let dev = Device::get(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"));
    assert!(
        watchdog::enabled(),
        "run with the watchdog on (CHORUS_WATCHDOG unset)"
    );
    let kernels = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = device_group("wd-a");
    let timeout = Duration::from_millis(300);
    let spin = Duration::from_secs(2);
    let short = pg.with_timeout(timeout);
    // Upload before the spin: a pageable copy would wait behind it.
    let buf = upload(&s, &[1.0, 2.0, 3.0]);
    s.synchronize().unwrap();
    let before = watchdog::stats();
    kernels.spin(&s, spin).unwrap();
    let t0 = Instant::now();
    let work = short.all_reduce(buf, ReduceOp::Sum).unwrap();
    let ev = work.end_event_handle();
    let res = block_on(work);
    let took = t0.elapsed();
    let err = res
        .expect_err("the op must time out behind a 2 s kernel")
        .error;
    println!(
        "awaited work failed after {took:?} (timeout {timeout:?}, detection {:?} after the deadline): {err}",
        took.saturating_sub(timeout)
    );
    assert!(matches!(err, WorkError::OpTimeout { .. }), "{err:?}");
    assert!(took >= timeout, "failed before its deadline: {took:?}");
    assert!(
        took <= timeout + Duration::from_millis(100),
        "the watchdog took {took:?} (> timeout + 100 ms)"
    );
    let after = watchdog::stats();
    assert!(
        after.timeouts > before.timeouts,
        "the watchdog counted no timeout: {before:?} -> {after:?}"
    );
    assert!(
        matches!(pg.error(), Some(WorkError::OpTimeout { .. })),
        "the group is failed with the timeout: {:?}",
        pg.error()
    );
    let log = log_text();
    assert!(
        log.contains("aborting NCCL communicator"),
        "the communicator was not aborted; log:\n{log}"
    );
    // A later op on the failed group is refused with its buffer.
    let refused = pg
        .all_reduce(upload(&s, &[5.0]), ReduceOp::Sum)
        .unwrap_err();
    println!("later op on the failed group: {}", refused.error);

    // A new group in the same process (same store, new name) works while
    // the old stream is still spinning.
    let t1 = Instant::now();
    let s2 = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg2 = device_group("wd-b");
    let built = t1.elapsed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let data: Vec<f32> = (0..4099).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let poison: Vec<f32> = (0..4099).map(|_| rng.gen_range(5.0..6.0)).collect();
    let want = reference_reduce(ReduceOp::Sum, std::slice::from_ref(&data));
    let out = block_on(pg2.all_reduce(upload(&s2, &data), ReduceOp::Sum).unwrap()).unwrap();
    let got = s2.clone_dtoh(out.slice()).unwrap();
    assert_eq!(got, want, "all_reduce on the new group");
    // Data moved by the new communicator: send_recv to self into a
    // poisoned buffer.
    let (_, o) = block_on(
        pg2.send_recv(upload(&s2, &data), upload(&s2, &poison), 0)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        s2.clone_dtoh(o.slice()).unwrap(),
        data,
        "send_recv on the new group"
    );
    println!(
        "new group wd-b: built in {built:?}; all_reduce + send_recv correct, {:?} after the failure (old spin still running: {})",
        t1.elapsed(),
        t0.elapsed() < spin
    );
    assert!(pg2.error().is_none());
    ev.event().synchronize().unwrap();
    dev.synchronize().unwrap();
}

/// For the unpolled-work tests: a stream, a device group `name` and the
/// same group with a 200 ms op timeout.
fn unpolled_setup(name: &str) -> (Stream, ProcessGroup, ProcessGroup, Duration) {
    let dev = Device::get(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"));
    assert!(
        watchdog::enabled(),
        "run with the watchdog on (CHORUS_WATCHDOG unset)"
    );
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = device_group(name);
    let timeout = Duration::from_millis(200);
    let short = pg.with_timeout(timeout);
    (s, pg, short, timeout)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_finished_op_nobody_polled_is_not_timed_out() {
    // A work holds its op until it is polled: an op that finished long
    // before its deadline, whose work nobody has polled, must not time out
    // (the watchdog asks its end event), nor one whose work was forgotten.
    let (s, pg, short, timeout) = unpolled_setup("wd-held");
    let data = [1.5f32, -2.0, 3.25];
    let before = watchdog::stats();
    let held = short.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap();
    let forgotten = short.all_reduce(upload(&s, &data), ReduceOp::Max).unwrap();
    std::mem::forget(forgotten);
    held.end_event().synchronize().unwrap();
    assert_eq!(held.status(), chorus::WorkStatus::Finished);
    // Five deadlines pass with the works unpolled.
    std::thread::sleep(timeout * 5);
    let after = watchdog::stats();
    assert_eq!(
        after.timeouts, before.timeouts,
        "a finished op was timed out: {before:?} -> {after:?}"
    );
    assert!(pg.error().is_none(), "group failed: {:?}", pg.error());
    // Both were retired past their deadline: their flight records say they
    // completed (a dump would not point at them as hung).
    let rec = pg.flight_record();
    assert_eq!(rec.len(), 2, "flight record: {rec:?}");
    assert!(
        rec.iter()
            .all(|r| r.state == chorus::flight_recorder::OpState::Completed),
        "flight record: {rec:?}"
    );
    let out = block_on(held).expect("the held op completes normally");
    assert_eq!(s.clone_dtoh(out.slice()).unwrap(), data);
    // The group still works.
    let out = block_on(pg.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(s.clone_dtoh(out.slice()).unwrap(), data);
    println!(
        "held + forgotten works, {:?} past a {timeout:?} deadline unpolled: no timeout, group healthy",
        timeout * 4
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_finished_group_nobody_polled_is_not_timed_out() {
    // The works of a group hold their ops as lone works do: a group that
    // finished, with its works unpolled past their deadline, must not time
    // out (each op's registry entry asks the group's end event).
    let (s, pg, short, timeout) = unpolled_setup("wd-group-held");
    let data = [0.5f32, 4.0, -1.25, 8.0];
    let before = watchdog::stats();
    let (a, b) = short
        .batched(|g| {
            Ok::<_, chorus::WorkError>((
                g.all_reduce(upload(&s, &data), ReduceOp::Sum)
                    .map_err(|r| r.error)?,
                g.all_reduce(upload(&s, &data), ReduceOp::Max)
                    .map_err(|r| r.error)?,
            ))
        })
        .unwrap();
    let (a, b) = (a.into_work().unwrap(), b.into_work().unwrap());
    a.end_event().synchronize().unwrap();
    std::thread::sleep(timeout * 5);
    let after = watchdog::stats();
    assert_eq!(
        after.timeouts, before.timeouts,
        "a finished group was timed out: {before:?} -> {after:?}"
    );
    assert!(pg.error().is_none(), "group failed: {:?}", pg.error());
    for w in [a, b] {
        let out = block_on(w).expect("the batched op completes normally");
        assert_eq!(s.clone_dtoh(out.slice()).unwrap(), data);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_after_a_timeout_reform_runs_on_new_communicators_and_buffers_come_back_only_when_safe() {
    let (s, pg, short, timeout) = unpolled_setup("wd-reform");
    let dev = Device::get(0).unwrap();
    let kernels = Kernels::load(&dev).unwrap();
    let data: Vec<f32> = (0..4099).map(|i| i as f32 * 0.25 - 7.0).collect();
    let r = block_on(pg.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(s.clone_dtoh(r.slice()).unwrap(), data);
    assert_eq!(pg.nccl_comms_created(), 1);

    // An op behind an 800 ms kernel times out after 200 ms: the GPU may
    // still run it, so its buffer does not come back with the error.
    let buf = upload(&s, &data);
    s.synchronize().unwrap();
    kernels.spin(&s, Duration::from_millis(800)).unwrap();
    let t0 = Instant::now();
    let work = short.all_reduce(buf, ReduceOp::Sum).unwrap();
    let ev = work.end_event_handle();
    let failed = block_on(work).expect_err("the op must time out behind an 800 ms kernel");
    assert!(
        matches!(failed.error, WorkError::OpTimeout { .. }),
        "{:?}",
        failed.error
    );
    assert!(t0.elapsed() >= timeout);
    let end_done = ev.event().query().unwrap();
    assert!(
        failed.buffers.is_none() || end_done,
        "a buffer came back while the GPU could still write it"
    );
    println!(
        "timed out after {:?}; end event complete at the failure: {end_done}; buffer back: {}",
        t0.elapsed(),
        failed.buffers.is_some()
    );

    // The survivor (this one rank) re-forms: a new group with its own
    // communicator, made while the old stream still spins.
    let t1 = Instant::now();
    let pg2 = block_on(pg.reform(Duration::from_millis(200))).unwrap();
    assert_eq!((pg2.epoch(), pg2.rank(), pg2.size()), (1, 0, 1));
    let s2 = dev.new_stream(StreamPriority::Normal).unwrap();
    let r = block_on(pg2.all_reduce(upload(&s2, &data), ReduceOp::Max).unwrap()).unwrap();
    assert_eq!(s2.clone_dtoh(r.slice()).unwrap(), data);
    assert_eq!(
        pg2.nccl_comms_created(),
        1,
        "the new group made its own communicator"
    );
    assert_eq!(pg.nccl_comms_created(), 1, "the aborted one was not remade");
    println!(
        "re-formed and ran on a new communicator {:?} after the failure (old spin still running: {})",
        t1.elapsed(),
        t0.elapsed() < Duration::from_millis(800)
    );
    // The old op's buffer is released by its retire queue once the GPU
    // passed its end.
    ev.event().synchronize().unwrap();
    dev.synchronize().unwrap();
}
