//! Finding cuBLAS before cudarc loads it.
//!
//! cudarc opens cuBLAS by bare file name through the dynamic linker
//! (`libcublas.so`, ..., `libcublas.so.13`, `libcublas.so.12`, ...:
//! [`chorus::cuda::library_names`]) and panics when none opens. The CUDA
//! toolkit and the pip packages put the library in folders the dynamic
//! linker does not search, so this module looks, in order, at:
//!
//! 1. `CHORUS_CUBLAS_LIBRARY`, if set: that file and nothing else;
//! 2. cudarc's names through the dynamic linker (`LD_LIBRARY_PATH`, the
//!    ldconfig cache): what cudarc itself would find;
//! 3. the toolkit's folders (`$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT`,
//!    `$CUDA_TOOLKIT_ROOT_DIR`, `/usr/local/cuda`, `/opt/cuda`: `lib64`,
//!    `lib`, `targets/x86_64-linux/lib`) and `/usr/lib/x86_64-linux-gnu`;
//! 4. the pip packages' folders (`nvidia/cu13/lib` of `nvidia-cublas` for
//!    CUDA 13, `nvidia/cublas/lib` of `nvidia-cublas-cu12`) in every
//!    Python package folder nccl-sys searches for NCCL
//!    ([`nccl_sys::SearchPlan`]).
//!
//! A file found in a folder is opened by its path, after the
//! `libcublasLt` beside it (which it needs); the dynamic linker then hands
//! that copy to cudarc's open by name, since its `SONAME`
//! (`libcublas.so.13`) is one of cudarc's names. The search checks this:
//! the library cudarc will open must be the one found (same address of
//! `cublasCreate_v2`), else it is an error naming both.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

/// The variable that names the cuBLAS file to use.
pub const ENV_CUBLAS: &str = "CHORUS_CUBLAS_LIBRARY";

/// The cuBLAS this process uses.
#[derive(Debug)]
pub struct BlasLibrary {
    /// What was opened (a name or a path) and how it was found.
    pub found: String,
    /// Keeps the library (and its `libcublasLt`) loaded for cudarc.
    _libs: Vec<Library>,
}

/// Why no cuBLAS is usable: the reason and every place searched.
#[derive(Clone, Debug)]
pub struct BlasNotFound {
    /// What failed.
    pub reason: String,
    /// The places looked at, in order.
    pub searched: Vec<String>,
}

/// Finds cuBLAS once per process (later calls return the same answer).
///
/// # Errors
///
/// [`BlasNotFound`] with every place searched.
pub fn cublas() -> Result<&'static BlasLibrary, BlasNotFound> {
    static LIB: OnceLock<Result<BlasLibrary, BlasNotFound>> = OnceLock::new();
    LIB.get_or_init(|| search(|k| std::env::var_os(k)))
        .as_ref()
        .map_err(Clone::clone)
}

fn search(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<BlasLibrary, BlasNotFound> {
    let names = chorus::cuda::library_names("cublas");
    let mut searched = Vec::new();
    if let Some(path) = var(ENV_CUBLAS).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        searched.push(format!("{} (from {ENV_CUBLAS})", path.display()));
        return open_file(&path, &names).map_err(|reason| BlasNotFound { reason, searched });
    }
    let mut first_failure = None;
    for name in &names {
        searched.push(format!("{name} (dynamic linker)"));
        // SAFETY: opening cuBLAS runs its initialisers, as cudarc's own
        // open (by the same name, next) would.
        match unsafe { Library::new(name) } {
            Ok(lib) => {
                return Ok(BlasLibrary {
                    found: format!("{name} (dynamic linker)"),
                    _libs: vec![lib],
                })
            }
            Err(e) => {
                first_failure.get_or_insert_with(|| format!("{name}: {e}"));
            }
        }
    }
    for dir in folders(&var) {
        for name in names.iter().filter(|n| n.contains(".so.")) {
            let file = dir.join(name);
            searched.push(file.display().to_string());
            if file.is_file() {
                match open_file(&file, &names) {
                    Ok(lib) => return Ok(lib),
                    Err(e) => {
                        first_failure.get_or_insert(e);
                    }
                }
            }
        }
    }
    Err(BlasNotFound {
        reason: first_failure
            .map(|f| format!("no cuBLAS library opened (first failure: {f})"))
            .unwrap_or_else(|| "no cuBLAS library opened".into()),
        searched,
    })
}

/// The folders of steps 3 and 4, in order, without repeats.
fn folders(var: &impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = [
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_TOOLKIT_ROOT_DIR",
    ]
    .iter()
    .filter_map(|k| var(k).filter(|v| !v.is_empty()).map(PathBuf::from))
    .collect();
    roots.push("/usr/local/cuda".into());
    roots.push("/opt/cuda".into());
    let mut dirs = Vec::new();
    for r in roots {
        for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            dirs.push(r.join(sub));
        }
    }
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    // The Python package folders nccl-sys searches: each candidate is
    // `<site>/nvidia/{nccl,cu13}/lib/libnccl.so.2`.
    let plan = nccl_sys::SearchPlan::from_vars(|k| var(k));
    for c in plan.candidates {
        if let nccl_sys::Candidate::Path(p) = c {
            if let Some(site) = p.ancestors().nth(4) {
                for sub in ["nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cu12/lib"] {
                    dirs.push(site.join(sub));
                }
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// Opens `file` (after the `libcublasLt` beside it) and checks that
/// cudarc's open by name will reach this copy.
fn open_file(file: &Path, names: &[String]) -> Result<BlasLibrary, String> {
    let mut libs = Vec::new();
    if let Some(dir) = file.parent() {
        for lt in chorus::cuda::library_names("cublasLt") {
            let p = dir.join(&lt);
            if lt.contains(".so.") && p.is_file() {
                // SAFETY: as for cuBLAS itself, below; a failure here shows
                // again (with its reason) when cuBLAS is opened.
                if let Ok(l) = unsafe { Library::new(&p) } {
                    libs.push(l);
                    break;
                }
            }
        }
    }
    // SAFETY: opening cuBLAS runs its initialisers, as cudarc's open would.
    let ours = unsafe { Library::new(file) }.map_err(|e| format!("{}: {e}", file.display()))?;
    let ours_sym = create_symbol(&ours).ok_or_else(|| {
        format!(
            "{} has no cublasCreate_v2: not a cuBLAS library",
            file.display()
        )
    })?;
    for name in names {
        // SAFETY: as above; a name that resolves to the copy just opened
        // only adds a reference to it.
        if let Ok(lib) = unsafe { Library::new(name) } {
            if create_symbol(&lib) == Some(ours_sym) {
                libs.push(ours);
                libs.push(lib);
                return Ok(BlasLibrary {
                    found: format!("{} (opened as {name})", file.display()),
                    _libs: libs,
                });
            }
            return Err(format!(
                "cudarc would open {name}, another cuBLAS than {} (put the one you want first \
                 on LD_LIBRARY_PATH, or name it in {ENV_CUBLAS})",
                file.display()
            ));
        }
    }
    Err(format!(
        "{} opened, but none of the names cudarc opens reaches it (its SONAME is none of {})",
        file.display(),
        names.join(", ")
    ))
}

/// The address of `cublasCreate_v2` in `lib`: tells two copies apart.
fn create_symbol(lib: &Library) -> Option<usize> {
    // SAFETY: only the symbol's address is read; it is never called here.
    unsafe { lib.get::<*const std::ffi::c_void>(b"cublasCreate_v2\0") }
        .ok()
        .map(|s| *s as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ffi::OsString;

    #[test]
    fn an_explicit_file_that_is_absent_is_the_only_place_searched() {
        let vars: HashMap<&str, OsString> =
            HashMap::from([(ENV_CUBLAS, OsString::from("/nonexistent/libcublas.so.13"))]);
        let e = search(|k| vars.get(k).cloned()).unwrap_err();
        assert_eq!(e.searched.len(), 1, "{e:?}");
        assert!(e.reason.contains("/nonexistent/libcublas.so.13"), "{e:?}");
    }

    #[test]
    fn the_folders_cover_the_toolkit_and_the_pip_packages() {
        let tmp = std::env::temp_dir().join(format!("chorus-cublas-plan-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("lib/python3.12/site-packages")).unwrap();
        let vars: HashMap<&str, OsString> = HashMap::from([
            ("VIRTUAL_ENV", tmp.clone().into_os_string()),
            ("CUDA_HOME", OsString::from("/opt/cuda-13")),
        ]);
        let dirs = folders(&|k: &str| vars.get(k).cloned());
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(dirs[0], PathBuf::from("/opt/cuda-13/lib64"));
        assert!(dirs.contains(&PathBuf::from("/usr/local/cuda/lib64")));
        let site = tmp.join("lib/python3.12/site-packages");
        assert!(dirs.contains(&site.join("nvidia/cu13/lib")), "{dirs:?}");
        assert!(dirs.contains(&site.join("nvidia/cublas/lib")), "{dirs:?}");
    }
}
