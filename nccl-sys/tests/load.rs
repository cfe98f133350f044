//! Loading NCCL where it is missing or wrong: typed errors, never panics.
//! These run everywhere (CI has no NCCL).

use std::ffi::OsString;

use nccl_sys::{Candidate, Nccl, NcclLoadError, SearchPlan, REQUIRED_SYMBOLS};

#[test]
fn explicit_library_that_does_not_exist_is_backend_unavailable() {
    let plan = SearchPlan::from_vars(|k| {
        (k == "CHORUS_NCCL_LIBRARY").then(|| OsString::from("/nonexistent/libnccl.so.2"))
    });
    match Nccl::load_with(&plan) {
        Err(NcclLoadError::BackendUnavailable { searched, reasons }) => {
            assert_eq!(
                searched,
                vec!["/nonexistent/libnccl.so.2 (from CHORUS_NCCL_LIBRARY)".to_owned()]
            );
            assert_eq!(reasons.len(), 1);
            assert!(
                reasons[0].contains("No such file"),
                "reason should carry dlerror: {reasons:?}"
            );
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn empty_search_plan_is_backend_unavailable() {
    let err = Nccl::load_with(&SearchPlan::default()).unwrap_err();
    assert!(matches!(
        &err,
        NcclLoadError::BackendUnavailable { searched, reasons } if searched.is_empty() && reasons.is_empty()
    ));
    assert!(err.to_string().contains("nothing was searched"), "{err}");
}

#[test]
fn search_lists_every_place_tried() {
    let missing_name = "libnccl-chorus-test-does-not-exist.so.2";
    let missing_file = std::env::temp_dir().join("chorus-no-such-dir/libnccl.so.2");
    let plan = SearchPlan {
        candidates: vec![
            Candidate::AlreadyLoaded(missing_name.into()),
            Candidate::Name(missing_name.into()),
            Candidate::Path(missing_file.clone()),
        ],
        unmatched: vec!["/venv/lib/python3*/site-packages/... (no python3.* folder)".into()],
    };
    match Nccl::load_with(&plan) {
        Err(NcclLoadError::BackendUnavailable { searched, reasons }) => {
            assert_eq!(searched.len(), 4, "{searched:?}");
            assert!(searched[0].contains("already loaded"));
            assert!(searched[1].contains("dynamic linker"));
            assert_eq!(searched[2], missing_file.display().to_string());
            assert!(searched[3].contains("python3*"));
            // The two names were tried and failed; the missing file was only
            // looked for.
            assert_eq!(reasons.len(), 2, "{reasons:?}");
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn a_library_that_is_not_nccl_is_a_missing_symbol_error() {
    match Nccl::load_from("libc.so.6") {
        Err(NcclLoadError::MissingSymbol { path, missing }) => {
            assert_eq!(path, "libc.so.6");
            assert_eq!(missing, REQUIRED_SYMBOLS.to_vec());
            let text = NcclLoadError::MissingSymbol { path, missing }.to_string();
            assert!(text.contains("ncclAllReduce") && text.contains("CHORUS_NCCL_LIBRARY"));
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_library_is_backend_unavailable_with_the_reason() {
    let dir = std::env::temp_dir().join(format!("chorus-fake-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("libnccl.so.2");
    std::fs::write(
        &fake,
        b"this is not an ELF file, just text pretending to be NCCL",
    )
    .unwrap();
    let result = Nccl::load_with(&SearchPlan::new(vec![Candidate::Path(fake.clone())]));
    std::fs::remove_dir_all(&dir).unwrap();
    match result {
        Err(NcclLoadError::BackendUnavailable { searched, reasons }) => {
            assert_eq!(searched, vec![fake.display().to_string()]);
            assert_eq!(reasons.len(), 1);
            assert!(reasons[0].starts_with(&fake.display().to_string()));
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn process_wide_nccl_is_a_value_not_a_panic() {
    // CI has no NCCL: a typed error. The GPU machine has one: a library.
    // Either way the second call returns the same answer without searching.
    let first = nccl_sys::nccl();
    let second = nccl_sys::nccl();
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            assert!(std::ptr::eq(*a, *b));
            println!("loaded NCCL {} from {}", a.version(), a.path());
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string());
            println!("no NCCL here: {a}");
        }
        _ => panic!("nccl() changed its answer between calls"),
    }
}
