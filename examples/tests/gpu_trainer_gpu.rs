//! The GPU trainer on one GPU (1-rank group): its losses match the CPU
//! reference and fall, and its parameters hash the same after every step.
//! Ignored by default; run on a GPU machine with `--include-ignored` (it
//! FAILS when no GPU is found).
#![forbid(unsafe_code)]

use std::time::Duration;

use chorus_examples::gpu_train::{train, Config};
use tests_integration::testkit::local_groups;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_trainer_matches_the_cpu_reference_and_learns() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = Config {
        width: 256,
        layers: 4,
        batch: 32,
        steps: 120,
        bucket_mib: 0.25,
        lr: 3.0,
        seed: 5,
        data_batches: 4,
        print_every: 40,
        check_steps: 4,
        check_tol: 5e-4,
        profile_steps: 3,
        profile: None,
        device: 0,
    };
    let report = rt.block_on(async {
        let pg = local_groups(1, Duration::from_secs(120)).await.remove(0);
        let r = train(&pg, &cfg).await;
        pg.shutdown().await.unwrap();
        r
    });
    let r = report.unwrap_or_else(|e| panic!("gpu trainer: {e}"));
    println!("{r:?}");
    assert_eq!(r.reference.len(), 4);
    assert!(
        r.reference_ok,
        "losses {:?} vs reference {:?}",
        &r.losses[..4],
        r.reference
    );
    assert!(r.loss_fell, "losses {:?}", r.losses);
    assert_eq!(r.hashes_checked, cfg.steps);
    assert!(r.buckets > 1, "small caps make several buckets");
    assert!(r.step_ms > 0.0);
}

#[test]
fn without_a_gpu_the_trainer_fails_with_a_typed_error() {
    if chorus::cuda::device_count().is_ok() {
        return; // a GPU machine: the ignored test above is the one
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = Config {
        width: 8,
        layers: 2,
        batch: 2,
        steps: 2,
        bucket_mib: 1.0,
        lr: 0.1,
        seed: 1,
        data_batches: 1,
        print_every: 0,
        check_steps: 1,
        check_tol: 1e-4,
        profile_steps: 0,
        profile: None,
        device: 0,
    };
    let err = rt.block_on(async {
        let pg = local_groups(1, Duration::from_secs(30)).await.remove(0);
        let r = train(&pg, &cfg).await;
        pg.shutdown().await.unwrap();
        r
    });
    let e = err.expect_err("no GPU here");
    assert!(e.to_string().contains("CUDA"), "{e}");
}
