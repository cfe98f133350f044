//! CPU tests of the CUDA layer: these run everywhere, GPU or not.

use cudarc::driver::{sys::CUresult, DriverError};

use super::device::{PriorityRange, StreamPriority};
use super::driver::probe_library;
use super::error::{guarded, CudaError};
use super::event::query_outcome;

#[test]
fn missing_driver_library_is_unavailable_listing_what_was_tried() {
    let names = vec![
        "libcuda-chorus-test-missing.so.1".to_owned(),
        "/nonexistent/libcuda.so".to_owned(),
    ];
    match probe_library(&names) {
        Err(CudaError::Unavailable { reason }) => {
            assert!(
                reason.contains("libcuda-chorus-test-missing.so.1"),
                "{reason}"
            );
            assert!(reason.contains("/nonexistent/libcuda.so"), "{reason}");
            assert!(reason.contains("cannot open shared object"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn probe_accepts_a_library_that_loads() {
    // libc stands in for a loadable library: the probe only checks loading.
    let names = vec!["libcuda-missing.so".to_owned(), "libc.so.6".to_owned()];
    assert_eq!(probe_library(&names), Ok("libc.so.6".to_owned()));
}

#[test]
fn event_query_maps_not_ready_to_pending_and_errors_to_errors() {
    assert_eq!(query_outcome(Ok(())), Ok(true));
    assert_eq!(
        query_outcome(Err(DriverError(CUresult::CUDA_ERROR_NOT_READY))),
        Ok(false)
    );
    for (code, num, name) in [
        (
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            700,
            "CUDA_ERROR_ILLEGAL_ADDRESS",
        ),
        (
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
            719,
            "CUDA_ERROR_LAUNCH_FAILED",
        ),
        (
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            400,
            "CUDA_ERROR_INVALID_HANDLE",
        ),
    ] {
        let err = query_outcome(Err(DriverError(code))).unwrap_err();
        assert_eq!(
            err,
            CudaError::Driver {
                call: "cuEventQuery",
                code: num,
                name: name.to_owned()
            }
        );
        assert_eq!(
            err.to_string(),
            format!("cuEventQuery failed: {name} (CUDA error {num})")
        );
    }
}

#[test]
fn priorities_resolve_into_the_device_range() {
    let r = PriorityRange {
        least: 0,
        greatest: -5,
    };
    assert_eq!(r.resolve(StreamPriority::Normal), 0);
    assert_eq!(r.resolve(StreamPriority::Highest), -5);
    assert_eq!(r.resolve(StreamPriority::Value(-2)), -2);
    assert_eq!(r.resolve(StreamPriority::Value(-9)), -5);
    assert_eq!(r.resolve(StreamPriority::Value(3)), 0);
}

#[test]
fn panics_inside_cudarc_become_unavailable() {
    let r: Result<(), CudaError> = guarded("cuTest", || panic!("Unable to dynamically load"));
    match r {
        Err(CudaError::Unavailable { reason }) => {
            assert!(reason.contains("cuTest") && reason.contains("Unable to dynamically load"));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
