//! The report's sections' places in their file: each between the markers
//! of its key, with paths relative to the file.

use std::path::Path;

/// The marker that opens the section `key`.
pub(crate) fn begin(key: &str) -> String {
    format!("<!-- chorus-bench:{key}:begin -->")
}

/// The marker that closes the section `key`.
pub(crate) fn end(key: &str) -> String {
    format!("<!-- chorus-bench:{key}:end -->")
}

/// `old` with the text between the markers of `key` replaced by `section`
/// (the markers kept), or `section` appended between new markers.
pub(crate) fn splice(old: &str, key: &str, section: &str) -> String {
    let (b, e) = (begin(key), end(key));
    let block = format!("{b}\n{}\n{e}", section.trim_end());
    match (old.find(&b), old.find(&e)) {
        (Some(i), Some(j)) if i < j => {
            format!("{}{block}{}", &old[..i], &old[j + e.len()..])
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
