//! No NCCL library (and, on CI, no GPU): every device entry point is a
//! typed error and host ops keep working. Runs everywhere: the library path
//! is pointed at nothing before anything loads NCCL.
#![forbid(unsafe_code)]

use std::sync::Arc;

use chorus::store::{InMemoryStore, Store};
use chorus::{Error, ProcessGroup, ReduceOp};
use chorus_gpu::nccl::{self, NcclCommError};
use futures::executor::block_on;

#[test]
fn without_nccl_or_gpu_device_ops_are_typed_errors() {
    std::env::set_var(
        "CHORUS_NCCL_LIBRARY",
        "/nonexistent/chorus-test/libnccl.so.2",
    );
    match nccl::unique_id() {
        Err(NcclCommError::Unavailable(why)) => {
            println!("{why}");
            assert!(
                why.contains("/nonexistent/chorus-test/libnccl.so.2"),
                "{why}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let pg = block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store.clone())
            .name("nonccl")
            .build(),
    )
    .unwrap();
    // Eager init of a device: CUDA unavailable (CI) or NCCL unavailable
    // (GPU machine), as a value naming what is missing.
    let e = block_on(pg.init_device(0)).unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::Setup { .. }), "{e:?}");
    assert!(e.to_string().contains("unavailable"), "{e}");
    assert_eq!(pg.nccl_comms_created(), 1, "the attempt is counted");
    // A group whose builder names a device fails to build, with the cause.
    let e = block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name("nonccl-eager")
            .device(0)
            .build(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("unavailable"), "{e}");
    // Host buffers still run on the TCP backend.
    let v: Vec<f32> = vec![1.5, -2.0, 3.25];
    let out = block_on(pg.all_reduce(v.clone(), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(out, v);
}
