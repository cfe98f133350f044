//! chorus-trace: reads every rank's flight-recorder dump in a folder and
//! names the first sequence number at which the ranks disagree, the ranks
//! that are behind, and each rank's last completed sequence number.
//!
//! ```text
//! chorus-trace DIR [--json]
//! ```
//!
//! Exits 0 when the ranks agree, 1 when a divergence was found, 2 on error.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use chorus_core::flight_recorder::{analyze, Dump};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    about = "Find where the ranks of a chorus job diverged, from their flight-recorder dumps"
)]
struct Args {
    /// Folder holding the dumps (chorus-trace-rank*.json).
    dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let entries = match std::fs::read_dir(&args.dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("chorus-trace: cannot read {}: {e}", args.dir.display());
            return ExitCode::from(2);
        }
    };
    let mut dumps = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("chorus-trace-rank") && name.ends_with(".json")) {
            continue;
        }
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<Dump>(&s).map_err(|e| e.to_string()));
        match parsed {
            Ok(d) => dumps.push(d),
            Err(e) => eprintln!("chorus-trace: skipping {}: {e}", path.display()),
        }
    }
    if dumps.is_empty() {
        eprintln!(
            "chorus-trace: no chorus-trace-rank*.json dumps in {}",
            args.dir.display()
        );
        return ExitCode::from(2);
    }
    dumps.sort_by_key(|d| d.rank);
    let reports = analyze(&dumps);
    let diverged = reports.iter().any(|r| r.first_divergence.is_some());
    if args.json {
        match serde_json::to_string_pretty(&reports) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("chorus-trace: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        let ranks: Vec<usize> = dumps.iter().map(|d| d.rank).collect();
        println!("dumps of ranks {ranks:?}");
        for r in &reports {
            println!("group '{}':", r.group);
            match &r.first_divergence {
                None => println!("  ranks agree on every recorded collective"),
                Some(d) => {
                    println!("  first divergence at seq {}", d.seq);
                    for (rank, what) in &d.issued {
                        println!(
                            "    rank {rank}: {}",
                            what.as_deref().unwrap_or("never issued it")
                        );
                    }
                    if !d.behind.is_empty() {
                        println!(
                            "  behind (never issued seq {}): ranks {:?}",
                            d.seq, d.behind
                        );
                    }
                    if !d.mismatched.is_empty() {
                        println!(
                            "  called a different op/dtype/count: ranks {:?}",
                            d.mismatched
                        );
                    }
                }
            }
            for (rank, seq) in &r.last_completed {
                println!(
                    "  rank {rank}: last completed seq {seq}, last issued seq {}",
                    r.last_issued.get(rank).copied().unwrap_or(0)
                );
            }
        }
    }
    if diverged {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
