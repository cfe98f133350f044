//! Reading the bench programs' output: JSON lines, rate lines, medians
//! over runs.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// The JSON objects among `text`'s lines (a `[rank R] ` prefix is skipped).
pub(crate) fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.find('{').map(|i| &l[i..]))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect()
}

pub(crate) fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Store ops/s keyed by (op, config), one vector entry per run.
pub(crate) type Rates = BTreeMap<(String, String), Vec<f64>>;

pub(crate) fn parse_rates(text: &str, who: &str, into: &mut Rates) {
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[0] == who {
            if let Ok(v) = f[3].parse::<f64>() {
                into.entry((f[1].to_string(), f[2].to_string()))
                    .or_default()
                    .push(v);
            }
        }
    }
}

/// One all_reduce figure set: medians over runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Point {
    pub(crate) bytes: usize,
    pub(crate) median_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) busbw_gbps: f64,
    /// CPU time of all ranks per op (µs; NaN where not reported).
    pub(crate) cpu_us: f64,
}

/// Per-size runs of (median, p99, busbw, CPU per op), merged by median.
pub(crate) fn merge_points(runs: &BTreeMap<usize, Vec<[f64; 4]>>) -> Vec<Point> {
    runs.iter()
        .filter_map(|(&bytes, v)| {
            let col = |i: usize| median(&v.iter().map(|x| x[i]).collect::<Vec<_>>());
            Some(Point {
                bytes,
                median_us: col(0)?,
                p99_us: col(1)?,
                busbw_gbps: col(2).unwrap_or(f64::NAN),
                cpu_us: col(3).unwrap_or(f64::NAN),
            })
        })
        .collect()
}

/// Bus bandwidth in GB/s from the unrounded figures (the JSON's own
/// `busbw_gbps` has three decimals, 0 for small messages).
pub(crate) fn busbw(bytes: f64, ranks: Option<f64>, median_us: f64) -> Option<f64> {
    let n = ranks?;
    (n >= 1.0 && median_us > 0.0).then(|| bytes * 2.0 * (n - 1.0) / n / (median_us * 1e-6) / 1e9)
}

/// Adds each row's (median, p99, busbw, CPU per op) to its size's runs;
/// returns how many rows it took.
pub(crate) fn add_runs(rows: &[Value], into: &mut BTreeMap<usize, Vec<[f64; 4]>>) -> usize {
    let mut n = 0;
    for r in rows {
        let f = |k: &str| r.get(k).and_then(Value::as_f64);
        if let (Some(b), Some(m), Some(p)) = (f("bytes"), f("median_us"), f("p99_us")) {
            into.entry(b as usize).or_default().push([
                m,
                p,
                busbw(b, f("ranks"), m)
                    .or(f("busbw_gbps"))
                    .unwrap_or(f64::NAN),
                f("cpu_us").unwrap_or(f64::NAN),
            ]);
            n += 1;
        }
    }
    n
}

/// Median over runs of `rows[width == w].<who>.<key>`.
pub(crate) fn group_med(runs: &[Value], w: u64, who: &str, key: &str) -> Option<f64> {
    med_at(runs, |v| {
        v.get("rows")?
            .as_array()?
            .iter()
            .find(|r| r.get("width").and_then(Value::as_u64) == Some(w))?
            .get(who)?
            .get(key)?
            .as_f64()
    })
}

pub(crate) fn read_json(p: &Path) -> Result<Value, String> {
    let s = std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    serde_json::from_str(&s).map_err(|e| format!("bad JSON in {}: {e}", p.display()))
}

/// Median over runs of the number at `path` (keys, or `wake[i].key`).
pub(crate) fn med_at(runs: &[Value], f: impl Fn(&Value) -> Option<f64>) -> Option<f64> {
    median(&runs.iter().filter_map(f).collect::<Vec<_>>())
}
