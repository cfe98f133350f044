//! The CUDA layer. The first tests run everywhere (CI has no GPU: typed
//! errors, no panic). The `gpu_` tests are ignored by default and run on the
//! GPU machine with `--include-ignored`; they FAIL when no GPU is found.
#![forbid(unsafe_code)]

use std::time::Duration;

use chorus_gpu::cuda::{self, CudaError, Device, StreamPriority};
use rand::{Rng, SeedableRng};

#[test]
fn without_cuda_every_entry_point_is_a_typed_error() {
    // On CI (no driver, no GPU) this is `Unavailable`; on a GPU machine
    // device 0 exists. Either way: a value, never a panic.
    let gpu_machine = std::env::var_os("CHORUS_GPU_MACHINE").is_some();
    match cuda::driver() {
        Ok(info) => {
            println!("CUDA driver present: {info:?}");
            assert!(info.device_count >= 1);
            let count = info.device_count;
            assert!(matches!(
                Device::get(count),
                Err(CudaError::NoSuchDevice { ordinal, count: c }) if ordinal == count && c == count
            ));
        }
        Err(e) => {
            assert!(
                !gpu_machine,
                "CHORUS_GPU_MACHINE is set but CUDA is unavailable: {e}"
            );
            println!("no CUDA here, as expected on CI: {e}");
            assert!(matches!(e, CudaError::Unavailable { .. }), "{e:?}");
            assert!(e.to_string().contains("TCP backend"));
            for r in [Device::get(0).map(|_| ()), cuda::device_count().map(|_| ())] {
                assert!(matches!(r, Err(CudaError::Unavailable { .. })), "{r:?}");
            }
        }
    }
}

fn device0() -> Device {
    match Device::get(0) {
        Ok(d) => d,
        Err(e) => panic!("this test needs a CUDA GPU: {e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_one_primary_context_per_device() {
    let info = cuda::driver().expect("CUDA driver");
    println!("driver {info:?}");
    let a = device0();
    let b = device0();
    assert!(std::sync::Arc::ptr_eq(a.context(), b.context()));
    assert!(a.context().is_primary());
    println!("device 0: {}", a.name().unwrap());
    let (free, total) = a.memory_info().unwrap();
    assert!(free > 0 && free <= total);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_streams_get_the_priority_asked_for() {
    let dev = device0();
    let range = dev.stream_priority_range().unwrap();
    println!("priority range: {range:?}");
    assert!(range.greatest <= range.least);
    let high = dev.new_stream(StreamPriority::Highest).unwrap();
    let normal = dev.new_stream(StreamPriority::Normal).unwrap();
    let clamped = dev.new_stream(StreamPriority::Value(-1000)).unwrap();
    assert_eq!(high.priority().unwrap(), range.greatest);
    assert_eq!(normal.priority().unwrap(), range.least);
    assert_eq!(clamped.priority().unwrap(), range.greatest);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_event_query_and_stream_wait_on_a_held_stream() {
    let dev = device0();
    let producer = dev.new_stream(StreamPriority::Normal).unwrap();
    let consumer = dev.new_stream(StreamPriority::Highest).unwrap();
    let produced = dev.new_event().unwrap();
    let consumed = dev.new_event().unwrap();
    // Never recorded: complete.
    assert_eq!(produced.query(), Ok(true));

    let hold = producer.hold(Duration::from_secs(30)).unwrap();
    produced.record(&producer).unwrap();
    consumer.wait_event(&produced).unwrap();
    consumed.record(&consumer).unwrap();
    // The producer is held, so neither event can have completed: this is
    // deterministic, not a race.
    assert_eq!(
        produced.query(),
        Ok(false),
        "producer event must be pending"
    );
    assert_eq!(
        consumed.query(),
        Ok(false),
        "the consumer stream waits on the producer's event"
    );
    // An independent stream is not held up.
    let other = dev.new_stream(StreamPriority::Normal).unwrap();
    let free = dev.new_event().unwrap();
    free.record(&other).unwrap();
    free.synchronize().unwrap();
    assert_eq!(free.query(), Ok(true));
    assert_eq!(consumed.query(), Ok(false));

    hold.release();
    consumed.synchronize().unwrap();
    assert_eq!(consumed.query(), Ok(true));
    assert_eq!(produced.query(), Ok(true));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_hold_reports_reached_and_gives_up_after_max() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let e = dev.new_event().unwrap();
    let hold = s.hold(Duration::from_millis(20)).unwrap();
    e.record(&s).unwrap();
    // The hold gives up by itself, so this returns even though `hold` lives.
    e.synchronize().unwrap();
    assert!(hold.is_reached());
    assert!(hold.timed_out());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_device_memory_round_trip() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let host: Vec<f32> = (0..100_003).map(|_| rng.gen_range(-1e6..1e6)).collect();
    let mut d = s.clone_htod(&host).unwrap();
    assert_eq!(s.clone_dtoh(&d).unwrap(), host);
    let other: Vec<f32> = (0..host.len()).map(|_| rng.gen()).collect();
    s.copy_htod(&other, &mut d).unwrap();
    assert_eq!(s.clone_dtoh(&d).unwrap(), other);
    assert!(matches!(
        s.copy_htod(&other[1..], &mut d),
        Err(CudaError::LengthMismatch {
            expected: 100_003,
            found: 100_002,
            ..
        })
    ));
    let z = s.alloc_zeros::<u32>(777).unwrap();
    assert_eq!(s.clone_dtoh(&z).unwrap(), vec![0u32; 777]);
}
