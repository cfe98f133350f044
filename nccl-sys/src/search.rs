//! Where chorus looks for `libnccl`, in order.
//!
//! 1. `CHORUS_NCCL_LIBRARY`, if set: that file and nothing else. An explicit
//!    choice that fails is an error, never a silent fall-back to another NCCL.
//! 2. A copy already loaded in the process (`dlopen("libnccl.so.2",
//!    RTLD_NOLOAD)`), e.g. by PyTorch, so that one process never holds two
//!    different NCCLs.
//! 3. `libnccl.so.2`, then `libnccl.so`, through the dynamic linker
//!    (`LD_LIBRARY_PATH`, the `ldconfig` cache, the system folders).
//! 4. The `nvidia/nccl/lib/libnccl.so.2` of the pip packages
//!    `nvidia-nccl-cu12` / `nvidia-nccl-cu13`, in the Python package folders
//!    of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `$PYTHONPATH`, every Python
//!    environment whose `bin/python3` is on `$PATH`, `~/.local`,
//!    `/usr/local`, `/usr` and `/opt/conda`.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable naming the NCCL library to use.
pub const ENV_LIBRARY: &str = "CHORUS_NCCL_LIBRARY";

/// Library name probed with `RTLD_NOLOAD` and through the dynamic linker.
pub const SONAME: &str = "libnccl.so.2";

/// Where a pip package puts the library, relative to a Python package folder.
const PIP_RELATIVE: [&str; 2] = [
    "nvidia/nccl/lib/libnccl.so.2",
    "nvidia/cu13/lib/libnccl.so.2",
];

/// One place to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// The file named by `CHORUS_NCCL_LIBRARY`.
    Explicit(String),
    /// A copy with this name already loaded in the process (`RTLD_NOLOAD`).
    AlreadyLoaded(String),
    /// A bare library name, resolved by the dynamic linker.
    Name(String),
    /// A file in a pip package folder.
    Path(PathBuf),
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Candidate::Explicit(p) => write!(f, "{p} (from {ENV_LIBRARY})"),
            Candidate::AlreadyLoaded(n) => write!(f, "{n} (already loaded in this process)"),
            Candidate::Name(n) => write!(f, "{n} (dynamic linker search path)"),
            Candidate::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The ordered list of places to look for NCCL.
///
/// [`SearchPlan::from_env`] builds the default one; tests build their own
/// with [`SearchPlan::new`] or [`SearchPlan::from_vars`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchPlan {
    /// The candidates, in the order they are tried.
    pub candidates: Vec<Candidate>,
    /// Patterns that were looked at while building the plan but matched no
    /// folder (shown in the "searched" list of errors).
    pub unmatched: Vec<String>,
}

impl SearchPlan {
    /// A plan with exactly these candidates.
    pub fn new(candidates: Vec<Candidate>) -> Self {
        Self {
            candidates,
            unmatched: Vec::new(),
        }
    }

    /// The default plan, from the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var_os(k))
    }

    /// The default plan, reading environment variables through `var`
    /// (`CHORUS_NCCL_LIBRARY`, `VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`,
    /// `PATH`, `HOME`) and looking at the file system for Python folders.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Self {
        if let Some(p) = var(ENV_LIBRARY).filter(|p| !p.is_empty()) {
            return Self::new(vec![Candidate::Explicit(p.to_string_lossy().into_owned())]);
        }
        let mut plan = Self::new(vec![
            Candidate::AlreadyLoaded(SONAME.to_owned()),
            Candidate::Name(SONAME.to_owned()),
            Candidate::Name("libnccl.so".to_owned()),
        ]);
        // In order: folders used directly, or folders holding python3.X/
        // subfolders with the named package folder inside each.
        enum Source {
            Direct(PathBuf),
            Versioned(PathBuf, &'static str),
        }
        let mut sources = Vec::new();
        for key in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(p) = var(key).filter(|p| !p.is_empty()) {
                sources.push(Source::Versioned(
                    PathBuf::from(p).join("lib"),
                    "site-packages",
                ));
            }
        }
        if let Some(pp) = var("PYTHONPATH") {
            sources.extend(
                std::env::split_paths(&pp)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(Source::Direct),
            );
        }
        // Python environments whose bin/ is on PATH (a venv used without
        // `activate`, e.g. /opt/torch/.venv/bin): their own site-packages.
        if let Some(path) = var("PATH") {
            for bin in std::env::split_paths(&path) {
                if bin.join("python3").is_file() {
                    if let Some(prefix) = bin.parent() {
                        sources.push(Source::Versioned(prefix.join("lib"), "site-packages"));
                    }
                }
            }
        }
        if let Some(home) = var("HOME").filter(|p| !p.is_empty()) {
            sources.push(Source::Versioned(
                PathBuf::from(home).join(".local/lib"),
                "site-packages",
            ));
        }
        sources.push(Source::Versioned("/usr/local/lib".into(), "dist-packages"));
        sources.push(Source::Versioned("/usr/local/lib".into(), "site-packages"));
        sources.push(Source::Direct("/usr/lib/python3/dist-packages".into()));
        sources.push(Source::Versioned("/usr/lib".into(), "site-packages"));
        sources.push(Source::Versioned("/opt/conda/lib".into(), "site-packages"));

        let mut site_dirs: Vec<PathBuf> = Vec::new();
        for source in sources {
            match source {
                Source::Direct(dir) => site_dirs.push(dir),
                Source::Versioned(lib_dir, leaf) => {
                    let found = python_dirs(&lib_dir);
                    if found.is_empty() {
                        plan.unmatched.push(format!(
                            "{}/python3*/{leaf}/nvidia/nccl/lib/{SONAME} (no python3.* folder)",
                            lib_dir.display()
                        ));
                    }
                    site_dirs.extend(found.into_iter().map(|d| d.join(leaf)));
                }
            }
        }
        let mut seen = HashSet::new();
        for dir in site_dirs {
            for rel in PIP_RELATIVE {
                let file = dir.join(rel);
                if seen.insert(file.clone()) {
                    plan.candidates.push(Candidate::Path(file));
                }
            }
        }
        plan
    }
}

/// The `python3.X` subfolders of `lib_dir`, newest Python first (sorted by
/// the minor version as a number, so 3.12 comes before 3.9).
fn python_dirs(lib_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib_dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("python3.")?.parse::<u32>().ok()?;
            e.path().is_dir().then(|| (minor, e.path()))
        })
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    dirs.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn explicit_library_is_the_only_candidate() {
        let plan = SearchPlan::from_vars(vars(&[
            (ENV_LIBRARY, "/nonexistent/libnccl.so.2"),
            ("VIRTUAL_ENV", "/somewhere"),
        ]));
        assert_eq!(
            plan.candidates,
            vec![Candidate::Explicit("/nonexistent/libnccl.so.2".into())]
        );
    }

    #[test]
    fn default_order_then_virtualenv_site_packages() {
        let tmp = std::env::temp_dir().join(format!("chorus-nccl-plan-{}", std::process::id()));
        let site9 = tmp.join("lib/python3.9/site-packages");
        let site12 = tmp.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(&site9).unwrap();
        std::fs::create_dir_all(&site12).unwrap();
        let plan = SearchPlan::from_vars(vars(&[
            ("VIRTUAL_ENV", tmp.to_str().unwrap()),
            ("PYTHONPATH", "/pp/a:/pp/b"),
        ]));
        let c = &plan.candidates;
        assert_eq!(c[0], Candidate::AlreadyLoaded("libnccl.so.2".into()));
        assert_eq!(c[1], Candidate::Name("libnccl.so.2".into()));
        assert_eq!(c[2], Candidate::Name("libnccl.so".into()));
        // The virtualenv comes first, newest Python first, then PYTHONPATH.
        assert_eq!(
            c[3],
            Candidate::Path(site12.join("nvidia/nccl/lib/libnccl.so.2"))
        );
        let pos = |p: PathBuf| {
            let want = Candidate::Path(p);
            c.iter().position(|x| *x == want).unwrap()
        };
        let p9 = pos(site9.join("nvidia/nccl/lib/libnccl.so.2"));
        let pa = pos(PathBuf::from("/pp/a/nvidia/nccl/lib/libnccl.so.2"));
        let pb = pos(PathBuf::from("/pp/b/nvidia/nccl/lib/libnccl.so.2"));
        assert!(3 < p9 && p9 < pa && pa < pb, "{c:?}");
        assert!(c.contains(&Candidate::Path(PathBuf::from(
            "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2"
        ))));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn python_environments_on_path_are_searched() {
        // Like the GPU machine: python3 is /opt/torch/.venv/bin/python3 on
        // PATH, VIRTUAL_ENV unset.
        let tmp = std::env::temp_dir().join(format!("chorus-nccl-path-{}", std::process::id()));
        let bin = tmp.join("venv/bin");
        let site = tmp.join("venv/lib/python3.12/site-packages");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(bin.join("python3"), b"").unwrap();
        let path = std::env::join_paths([tmp.join("nothing-here"), bin.clone()]).unwrap();
        let plan = SearchPlan::from_vars(vars(&[("PATH", path.to_str().unwrap())]));
        assert_eq!(
            plan.candidates[3],
            Candidate::Path(site.join("nvidia/nccl/lib/libnccl.so.2")),
            "{:?}",
            plan.candidates
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
