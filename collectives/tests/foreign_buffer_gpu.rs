//! A buffer type chorus did not write: memory allocated with cudarc on a
//! stream of its own, handed to chorus through the open `DeviceMem` trait.
//!
//! The `gpu_` tests are ignored by default and run on the GPU machine with
//! `--include-ignored`; they FAIL when no GPU is found.

use std::sync::Arc;
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::{DType, DeviceMem, ProcessGroup, ReduceOp, Stream};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use futures::executor::block_on;

/// Another library's buffer: a cudarc allocation, the cudarc stream that
/// produces it, and chorus's handle on that same stream.
#[derive(Debug)]
struct Foreign {
    slice: CudaSlice<f32>,
    cudarc_stream: Arc<CudaStream>,
    stream: Stream,
}

impl Foreign {
    fn new(cs: &Arc<CudaStream>, data: &[f32]) -> Foreign {
        Foreign {
            slice: cs.clone_htod(data).unwrap(),
            cudarc_stream: cs.clone(),
            stream: Stream::from_cudarc(cs.clone()).unwrap(),
        }
    }

    fn read(&self) -> Vec<f32> {
        self.cudarc_stream.clone_dtoh(&self.slice).unwrap()
    }
}

// SAFETY: the pointer and length are those of `slice`, one allocation of
// `len` f32s on the device of `stream`, fixed for the value's life; `slice`
// is owned by the value, so the memory lives until it is dropped; `stream`
// wraps the cudarc stream every read and write of it outside chorus goes to
// (the uploads and `read`).
unsafe impl DeviceMem for Foreign {
    fn device_ptr(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(&self.cudarc_stream);
        ptr
    }
    fn count(&self) -> usize {
        self.slice.len()
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}

fn cudarc_stream() -> Arc<CudaStream> {
    let ctx = CudaContext::new(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"));
    ctx.new_stream().unwrap()
}

fn group(name: &str) -> ProcessGroup {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name(name)
            .timeout(Duration::from_secs(60))
            .build(),
    )
    .unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ops_run_on_a_buffer_type_chorus_did_not_write() {
    let cs = cudarc_stream();
    let pg = group("foreign");
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();

    // In place, stream-ordered on the foreign stream: the read on that
    // stream sees the result without any host wait.
    let b = pg
        .all_reduce(Foreign::new(&cs, &data), ReduceOp::Max)
        .unwrap()
        .stream_ordered()
        .unwrap();
    assert_eq!(b.read(), data);

    // Out of place, GPU-finished.
    let out = Foreign::new(&cs, &vec![-1.0; 1000]);
    let (inp, out) = block_on(pg.all_gather(Foreign::new(&cs, &data), out).unwrap()).unwrap();
    assert_eq!(out.read(), data);
    assert_eq!(inp.read(), data);

    // Broadcast from rank 0 and a batch of two, coalesced.
    let b = block_on(pg.broadcast(Foreign::new(&cs, &data), 0).unwrap()).unwrap();
    assert_eq!(b.read(), data);
    let bufs = vec![Foreign::new(&cs, &data), Foreign::new(&cs, &data[..10])];
    let back = block_on(pg.all_reduce_coalesced(bufs, ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(back[1].read(), data[..10]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_refused_foreign_buffer_comes_back_untouched() {
    let cs = cudarc_stream();
    let pg = group("foreign-refused");
    let data = vec![3.0f32; 64];
    // An output too small for the gathered input.
    let small = Foreign::new(&cs, &[0.0; 8]);
    let r = pg.all_gather(Foreign::new(&cs, &data), small);
    let rejected = match r {
        Err(e) => e,
        Ok(_) => panic!("an output smaller than the input was accepted"),
    };
    let msg = rejected.to_string();
    assert!(msg.contains("all_gather"), "{msg}");
    let (inp, out) = rejected.into_buffers();
    assert_eq!(inp.read(), data);
    assert_eq!(out.read(), vec![0.0; 8]);
}
