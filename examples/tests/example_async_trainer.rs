//! Smoke tests of `examples/async_trainer/`: it launches its own ranks,
//! trains at a small size, and must report a falling loss, bit-identical
//! parameters and its overlap; a rank whose parameters are perturbed must
//! make it fail loudly.
#![forbid(unsafe_code)]

use std::process::Output;

use tests_integration::testkit::run_self_launching;

/// Runs the trainer (it launches `--nproc` ranks of itself).
fn run(args: &[&str]) -> (Output, String) {
    run_self_launching("async_trainer", args)
}

/// The two numbers of `loss fell from A to B`.
fn losses(text: &str) -> (f64, f64) {
    let line = text
        .lines()
        .find(|l| l.contains("loss fell from"))
        .unwrap_or_else(|| panic!("no loss line:\n{text}"));
    let rest = line.split("loss fell from ").nth(1).expect("loss values");
    let mut it = rest.split_whitespace();
    let a: f64 = it.next().and_then(|v| v.parse().ok()).expect("initial");
    assert_eq!(it.next(), Some("to"), "{line}");
    let b: f64 = it.next().and_then(|v| v.parse().ok()).expect("final");
    (a, b)
}

/// `X ms of it (P%) hidden`: the hidden time per step, in ms.
fn hidden_ms(text: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.contains("per step (mean over ranks)"))
        .unwrap_or_else(|| panic!("no overlap line:\n{text}"));
    let before = line.split(" ms of it (").next().expect("hidden");
    before
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the hidden time in {line}"))
}

#[test]
fn overlapped_training_converges_with_identical_parameters() {
    let (out, text) = run(&["--nproc", "2", "--quick"]);
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    let epochs = text.lines().filter(|l| l.contains("eval loss")).count();
    assert_eq!(epochs, 5, "initial + 4 epoch lines expected:\n{text}");
    assert!(
        text.contains("[####################]"),
        "no full progress bar:\n{text}"
    );
    let (initial, last) = losses(&text);
    assert!(
        last < initial / 2.0,
        "loss {initial} -> {last} did not halve:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("parameters bit-identical on all 2 ranks")
                && l.contains("after each of 128 steps")
                && l.ends_with("OK")),
        "{text}"
    );
    assert!(text.contains("4 buckets, overlapped"), "{text}");
    hidden_ms(&text);
}

#[test]
fn sequential_mode_hides_nothing_on_three_ranks() {
    // Buckets submitted after backward: by the example's definition no
    // communication can be hidden, so the measure must say 0.
    let (out, text) = run(&[
        "--nproc",
        "3",
        "--quick",
        "--sequential",
        "--buckets",
        "3",
        "--epochs",
        "3",
    ]);
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    let (initial, last) = losses(&text);
    assert!(last < initial / 2.0, "{initial} -> {last}:\n{text}");
    assert!(
        text.contains("parameters bit-identical on all 3 ranks"),
        "{text}"
    );
    assert_eq!(hidden_ms(&text), 0.0, "{text}");
}

#[test]
fn diverging_parameters_fail_loudly() {
    // Rank 1 flips one bit of one parameter after step 5.
    let (out, text) = run(&["--nproc", "2", "--quick", "--inject-divergence", "5"]);
    assert!(
        !out.status.success(),
        "a divergence must fail the run:\n{text}"
    );
    assert!(
        text.contains("PARAMETERS DIVERGED after step 5"),
        "the divergence was not named:\n{text}"
    );
}

#[test]
fn device_cuda_runs_on_a_gpu_or_fails_with_the_reason() {
    let (out, text) = run(&["--nproc", "1", "--quick", "--device", "cuda"]);
    let gpus = chorus::cuda::device_count().unwrap_or(0);
    if gpus > 0 {
        // On a GPU machine the buckets go through NCCL and training works.
        assert!(out.status.success(), "{:?}\n{text}", out.status);
        assert!(text.contains("buckets on GPU (nccl)"), "{text}");
    } else {
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains("--device cuda: rank 0: CUDA unavailable"),
            "the failure must say why:\n{text}"
        );
    }
}

#[test]
fn device_auto_falls_back_to_the_host_without_a_gpu() {
    let (out, text) = run(&["--nproc", "2", "--quick", "--sequential"]);
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    let gpus = chorus::cuda::device_count().unwrap_or(0);
    if gpus < 2 {
        assert!(text.contains("buckets on host (tcp)"), "{text}");
    }
    let (a, b) = losses(&text);
    assert!(b < a / 2.0, "{text}");
}
