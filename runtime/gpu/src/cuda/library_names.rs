//! The file names of the CUDA libraries (the driver, cuBLAS, ...), in the
//! order cudarc's loader tries them.
//!
//! cudarc's own list (`cudarc::get_lib_name_candidates`) exists only when
//! cudarc loads the libraries at run time; when another crate in the build
//! asks cudarc to link them instead, that function is compiled out. chorus
//! probes the same names either way, so it keeps its own copy, keyed on the
//! CUDA version of the bindings cudarc was built with.

use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};

use cudarc::driver::sys::CUDA_VERSION;

/// The library stems cudarc's loader tries, in order.
const STEMS: [&str; 2] = ["cuda", "nvcuda"];

/// Every name cudarc's loader would try for the driver library, in its
/// order, without repeats.
pub(crate) fn driver_library_names() -> Vec<String> {
    let mut names = Vec::new();
    for stem in STEMS {
        for name in library_names(stem) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Every file name cudarc's loader tries, in its order and without
/// repeats, for the library `stem` (`"cublas"`, `"cublasLt"`, `"nvrtc"`):
/// `libcublas.so`, ..., `libcublas.so.13`, `libcublas.so.12`, ... for the
/// CUDA version of the bindings cudarc was built with. A program that loads
/// such a library from a folder of its own (a pip package's) before cudarc
/// does must load a file whose `SONAME` is one of these names, or cudarc
/// will not find it.
pub fn library_names(stem: &str) -> Vec<String> {
    let mut names = Vec::new();
    for name in names_for(stem, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// cudarc's candidates for one library stem and the bindings' CUDA version.
fn names_for(stem: &str, major: u32, minor: u32) -> [String; 17] {
    let (p, s) = (DLL_PREFIX, DLL_SUFFIX);
    let w = usize::BITS;
    [
        format!("{p}{stem}{s}"),
        format!("{p}{stem}{w}{s}"),
        format!("{p}{stem}{w}_{major}{s}"),
        format!("{p}{stem}{w}_{major}{minor}{s}"),
        format!("{p}{stem}{w}_{major}{minor}_0{s}"),
        format!("{p}{stem}{w}_{major}0_{minor}{s}"),
        format!("{p}{stem}{w}_10{s}"),
        format!("{p}{stem}{w}_11{s}"),
        format!("{p}{stem}{w}_12{s}"),
        format!("{p}{stem}{w}_{major}0_0{s}"),
        format!("{p}{stem}{w}_9{s}"),
        format!("{p}{stem}{s}.{major}"),
        format!("{p}{stem}{s}.12"),
        format!("{p}{stem}{s}.11"),
        format!("{p}{stem}{s}.10"),
        format!("{p}{stem}{s}.9"),
        format!("{p}{stem}{s}.1"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_names_start_plain_and_end_with_the_soname() {
        let names = names_for("cuda", 12, 8);
        assert_eq!(names[0], format!("{DLL_PREFIX}cuda{DLL_SUFFIX}"));
        assert_eq!(names[3], format!("{DLL_PREFIX}cuda64_128{DLL_SUFFIX}"));
        assert_eq!(names[16], format!("{DLL_PREFIX}cuda{DLL_SUFFIX}.1"));
    }

    #[test]
    fn the_full_list_has_no_repeats_and_tries_cuda_first() {
        let names = driver_library_names();
        let mut seen = std::collections::HashSet::new();
        assert!(names.iter().all(|n| seen.insert(n)));
        assert!(names[0].contains("cuda") && !names[0].contains("nvcuda"));
    }
}
