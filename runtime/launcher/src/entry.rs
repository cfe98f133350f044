//! The launcher as functions: [`main_from_args`] is the `chorus-run`
//! command line, [`launch_local`] starts ranks of a program from a library.

use std::ffi::OsString;

use clap::Parser;

use crate::{cli, supervise};

/// Runs `chorus-run` with a full command line (`argv[0]` first) and returns
/// its exit code: 0 when every rank exits 0, otherwise the first failing
/// rank's code (128+N for signal N), 2 for a bad command line.
pub fn main_from_args<I, T>(argv: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match cli::Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            // --help and --version print to stdout and succeed.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let plan = match cli::Plan::from_args(&args) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("chorus-run: {msg}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chorus-run: cannot start the tokio runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(supervise::run(args, plan));
    drop(rt);
    code
}

/// Starts `nproc` local ranks of `program args...` on this node, as
/// `chorus-run --nproc-per-node N -- program args...` would, waits for them
/// and returns the exit code. Blocks the calling thread.
pub fn launch_local(nproc: usize, program: &std::path::Path, args: &[String]) -> i32 {
    let mut argv: Vec<OsString> = vec![
        "chorus-run".into(),
        "--nproc-per-node".into(),
        nproc.to_string().into(),
        "--".into(),
        program.as_os_str().to_owned(),
    ];
    argv.extend(args.iter().map(OsString::from));
    main_from_args(argv)
}
