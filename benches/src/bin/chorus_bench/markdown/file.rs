//! The report's place in its file: between the chorus-bench markers, with
//! paths relative to the file.

use std::path::Path;

pub(crate) const BEGIN: &str = "<!-- chorus-bench:begin -->";
pub(crate) const END: &str = "<!-- chorus-bench:end -->";

/// `old` with the text between the markers replaced by `section` (the
/// markers kept), or `section` appended between new markers.
pub(crate) fn splice(old: &str, section: &str) -> String {
    let block = format!("{BEGIN}\n{}\n{END}", section.trim_end());
    match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{block}{}", &old[..b], &old[e + END.len()..])
        }
        _ if old.trim().is_empty() => format!("# Benchmark results\n\n{block}\n"),
        _ => format!("{}\n\n{block}\n", old.trim_end()),
    }
}

/// `target` relative to `base` when it lies under it.
pub(crate) fn relative(target: &Path, base: &Path) -> String {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (t, b) = (abs(target), abs(base));
    t.strip_prefix(&b)
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| t.display().to_string())
}
