//! Where a section's figures come from: the machine, the commit, the
//! command, the date.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::env::Env;

/// The machine in one line: CPU, cores, memory, OS, kernel, load at the
/// start, the run's niceness, the GPU and PyTorch.
pub(crate) fn machine(env: &Env) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |s| s.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or("?".to_string(), |kb| {
            format!("{:.0} GiB", kb / 1024.0 / 1024.0)
        });
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                l.trim_start_matches("PRETTY_NAME=")
                    .trim_matches('"')
                    .to_string()
            })
        })
        .unwrap_or_else(|| "unknown OS".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    // Field 19 of /proc/self/stat, counted after the command name's ')'.
    let nice = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(16).map(str::to_string))
        })
        .unwrap_or_else(|| "?".into());
    let gpu = match &env.gpu {
        Ok(g) => g.clone(),
        Err(_) => "none".into(),
    };
    let torch = match &env.torch {
        Ok(v) => v.clone(),
        Err(_) => "none".into(),
    };
    format!(
        "{cpu}, {cores} cores, {mem}; {os}, Linux {}; load {} at the start, niceness {nice}; GPU: {gpu}; PyTorch: {torch}",
        kernel.trim(),
        load.join(" ")
    )
}

/// Where a section's figures come from: the date, the commit, the machine
/// and the command, as the section's first lines.
#[derive(Debug, Clone)]
pub(crate) struct Provenance {
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) machine: String,
    pub(crate) command: String,
}

impl Provenance {
    pub(crate) fn write(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "Measured {} at commit `{}` by the command below, on {}.\n\n    {}\n",
            self.date, self.commit, self.machine, self.command
        );
    }
}

/// The commit of this checkout, `+changes` when a tracked file other than
/// the report (`out`) and its plots differs from it; `unknown` outside a
/// git checkout.
pub(crate) fn commit_here(out: &std::path::Path, plots: &std::path::Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]).map(|h| h.trim().to_string()) else {
        return "unknown".into();
    };
    // The report and its plots, as paths from the checkout's root.
    let root = git(&["rev-parse", "--show-toplevel"]).map(|r| std::path::PathBuf::from(r.trim()));
    let from_root = |p: &std::path::Path| {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        root.as_ref()
            .and_then(|r| abs.strip_prefix(r).ok())
            .map(|r| r.to_string_lossy().into_owned())
    };
    let (out, plots) = (from_root(out), from_root(plots));
    let changed = git(&["status", "--porcelain", "--untracked-files=no"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.get(3..))
        .any(|path| {
            out.as_deref() != Some(path) && !plots.as_deref().is_some_and(|p| path.starts_with(p))
        });
    if changed {
        format!("{head}+changes")
    } else {
        head
    }
}

pub(crate) fn shell_quote(a: &str) -> String {
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+".contains(c))
    {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// "YYYY-MM-DD HH:MM UTC" of now.
pub(crate) fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}
