//! Figures as the report and the plots print them.

pub(crate) fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else {
        format!("{:.1}k", v / 1e3)
    }
}

pub(crate) fn yes_no(b: bool) -> String {
    if b {
        "yes".into()
    } else {
        "**no**".into()
    }
}

pub(crate) fn skipped_cell(reason: Option<&str>) -> String {
    match reason {
        Some(_) => "skipped".into(),
        None => "—".into(),
    }
}

pub(crate) fn fmt_bytes(b: usize) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

pub(crate) fn fmt_gbps(v: f64) -> String {
    if !v.is_finite() {
        "—".into()
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else if v >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.5}")
    }
}

pub(crate) fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}
