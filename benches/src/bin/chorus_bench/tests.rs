use std::collections::BTreeMap;

use crate::markdown::{begin, end, splice, utc_now};
use crate::parse::{add_runs, json_lines, median, parse_rates, Rates};

#[test]
fn splice_replaces_its_section_and_keeps_the_rest() {
    let old = format!(
        "# R\n\nhand written\n\n{}\nold store\n{}\n\n## After\nkept\n\n{}\nold tcp\n{}\n",
        begin("store"),
        end("store"),
        begin("tcp"),
        end("tcp")
    );
    let new = splice(&old, "store", "new store\n");
    assert!(new.contains("hand written") && new.contains("## After\nkept"));
    assert!(new.contains("new store") && !new.contains("old store"));
    assert!(new.contains("old tcp"), "another section is left as it was");
    assert_eq!(new.matches(&begin("store")).count(), 1);
    // Idempotent shape on a second run.
    let again = splice(&new, "store", "third");
    assert_eq!(again.matches(&end("store")).count(), 1);
    assert!(again.contains("third") && !again.contains("new store"));
}

#[test]
fn splice_appends_a_section_without_markers() {
    let new = splice("# R\n\n## Store\ntable\n", "tcp", "run");
    assert!(new.starts_with("# R\n\n## Store\ntable\n\n"));
    assert!(new.trim_end().ends_with(&end("tcp")));
    assert!(splice("", "tcp", "run").starts_with("# Benchmark results"));
}

#[test]
fn median_of_odd_even_and_nan() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    assert_eq!(median(&[]), None);
}

#[test]
fn parses_prefixed_json_and_rate_lines() {
    let rows = json_lines(
        "[rank 0] {\"bytes\":4,\"median_us\":10.5,\"p99_us\":20,\"busbw_gbps\":0.001}\nnoise\n",
    );
    let mut m = BTreeMap::new();
    assert_eq!(add_runs(&rows, &mut m), 1);
    assert_eq!(m[&4][0][..3], [10.5, 20.0, 0.001]);
    assert!(m[&4][0][3].is_nan(), "no CPU figure");
    let rows =
        json_lines("{\"ranks\":2,\"bytes\":1000,\"median_us\":1,\"p99_us\":2,\"busbw_gbps\":0}");
    add_runs(&rows, &mut m);
    assert!(
        (m[&1000][0][2] - 1.0).abs() < 1e-9,
        "busbw from unrounded figures"
    );
    let mut r = Rates::new();
    parse_rates(
        "# header\nchorus set     1   12345\ntorch get 16 99\nchorus add 1x32 7\n",
        "chorus",
        &mut r,
    );
    assert_eq!(r.len(), 2);
    assert_eq!(r[&("set".into(), "1".into())], vec![12345.0]);
}

#[test]
fn utc_date_is_well_formed() {
    let s = utc_now();
    assert_eq!(s.len(), "2026-11-29 17:13 UTC".len());
    assert!(s.starts_with("20"));
}
