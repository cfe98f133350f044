//! What a `chorus-run` job prints, for the multi-process tests: its
//! standard output line by line on a thread, each line without the
//! launcher's `[rank R] ` prefix, and the `key=value` fields of the lines
//! the rank programs report with.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

/// Reads `out` line by line on a thread; the lines arrive on the receiver
/// until `out` closes (or the receiver is dropped).
pub fn lines(out: impl Read + Send + 'static) -> (Receiver<String>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (rx, reader)
}

/// Starts `cmd` (a `chorus-run` job) with its standard output read line by
/// line ([`lines`]) and its standard error passed through.
///
/// # Panics
///
/// If the job cannot be started: test helper only.
pub fn spawn(
    cmd: &mut std::process::Command,
) -> (std::process::Child, Receiver<String>, JoinHandle<()>) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start chorus-run");
    let stdout = child.stdout.take().expect("stdout");
    let (rx, reader) = lines(stdout);
    (child, rx, reader)
}

/// `line` without the launcher's `[rank R] ` prefix (as is if it has none).
pub fn body(line: &str) -> &str {
    line.split_once("] ").map_or(line, |(_, b)| b)
}

/// The value of `key` in a line of `key=value` words.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Whether process `pid` exists (a zombie counts).
pub fn alive(pid: i32) -> bool {
    // Signal "none" only checks the pid.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_prefixes() {
        let l = "[rank 2] RESULT rank=2 kind=PeerLost elapsed_ms=12 msg=a b=c";
        assert_eq!(
            body(l),
            "RESULT rank=2 kind=PeerLost elapsed_ms=12 msg=a b=c"
        );
        assert_eq!(field(body(l), "kind"), Some("PeerLost"));
        assert_eq!(field(body(l), "rank"), Some("2"));
        assert_eq!(field(body(l), "missing"), None);
        assert_eq!(body("no prefix"), "no prefix");
        let (rx, t) = lines(&b"one\ntwo\n"[..]);
        assert_eq!(rx.iter().collect::<Vec<_>>(), vec!["one", "two"]);
        t.join().unwrap();
        assert!(alive(std::process::id() as i32));
    }
}
