//! Reports of long waits: a rank that waits for others (to join the job,
//! to leave it, for the survivors of a failure to agree, to be admitted as
//! a replacement) says every few seconds what it waits for, where, how far
//! the others got and how long it has waited, so that no wait is silent.
//!
//! A [`Waiting`] wraps the wait's future; the wait itself and its bound
//! are the caller's and stay as they are. Each report is a `tracing`
//! event at `info` (target `chorus::wait`) and, when the thread that
//! reports has no tracing subscriber (none was set globally: chorus's I/O
//! threads see only the global one), a line on stderr, so that a program
//! that set up no logging still shows it. The first stderr line of a
//! process says how to turn them off.
//!
//! The period is [`set_every`], else `CHORUS_WAIT_REPORT_S` (seconds,
//! decimals allowed), else [`DEFAULT_EVERY`]; zero turns reports off.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a wait reports by default.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);

/// [`set_every`]'s value in milliseconds; `u64::MAX` while unset.
static EVERY_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Set once the first report went to stderr.
static TOLD_HOW_TO_SILENCE: AtomicBool = AtomicBool::new(false);

/// Sets how often waits report, for every wait of the process from its
/// next report on (the builder equivalent of `CHORUS_WAIT_REPORT_S`);
/// zero turns reports off.
pub fn set_every(every: Duration) {
    let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX - 1);
    EVERY_MS.store(ms.min(u64::MAX - 1), Ordering::Relaxed);
}

/// How often waits report: [`set_every`]'s value, else
/// `CHORUS_WAIT_REPORT_S`, else [`DEFAULT_EVERY`]. Zero: never.
pub fn every() -> Duration {
    match EVERY_MS.load(Ordering::Relaxed) {
        u64::MAX => crate::config::wait_report_every().unwrap_or(DEFAULT_EVERY),
        ms => Duration::from_millis(ms),
    }
}

/// What a report says of the others' progress (`"3 of 8 ranks joined"`),
/// asked anew for each report; `None` when it cannot be had.
type Probe<'a> =
    Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>> + Send + 'a>;

/// A wait that reports while it lasts (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// # use std::time::{Duration, Instant};
/// use chorus_store::wait_report::Waiting;
/// # futures::executor::block_on(async {
/// let started = Instant::now();
/// let wait = Waiting::new("rank 1 waits for the others", started, Duration::from_secs(300))
///     .hint("did every rank start?")
///     .run(async { 42 });
/// // On chorus's I/O runtime, which has the timers it needs.
/// assert_eq!(chorus_store::rt::run(wait).await, Ok(42));
/// # });
/// ```
pub struct Waiting<'a> {
    what: String,
    started: Instant,
    limit: Duration,
    hint: Option<String>,
    probe: Option<Probe<'a>>,
    every: Option<Duration>,
    sink: Box<dyn FnMut(&str) + Send>,
}

impl std::fmt::Debug for Waiting<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("what", &self.what)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<'a> Waiting<'a> {
    /// A wait for `what` (who waits, for what, where: `"rank 1 waits for
    /// the job's 4 ranks to join, through the store at 10.0.0.1:29500"`)
    /// that began at `started` and gives up `limit` after it.
    pub fn new(what: impl Into<String>, started: Instant, limit: Duration) -> Waiting<'a> {
        Waiting {
            what: what.into(),
            started,
            limit,
            hint: None,
            probe: None,
            every: None,
            sink: Box::new(emit),
        }
    }

    /// What to check while it waits (`"is rank 0 running?"`), at the end
    /// of each report.
    #[must_use]
    pub fn hint(mut self, hint: impl Into<String>) -> Waiting<'a> {
        self.hint = Some(hint.into());
        self
    }

    /// How far the others got, asked anew for each report (a store read,
    /// say): `None` leaves it out. It runs beside the wait, which is never
    /// held up by it, and is given up after the report period.
    #[must_use]
    pub fn progress<F, P>(mut self, mut probe: F) -> Waiting<'a>
    where
        F: FnMut() -> P + Send + 'a,
        P: Future<Output = Option<String>> + Send + 'a,
    {
        self.probe = Some(Box::new(move || Box::pin(probe())));
        self
    }

    /// Runs `wait` to its end, reporting every period while it lasts.
    /// Needs a tokio runtime with timers (chorus's I/O runtime,
    /// [`rt`](crate::rt)).
    pub async fn run<T>(mut self, wait: impl Future<Output = T>) -> T {
        let mut wait = std::pin::pin!(wait);
        loop {
            let every = self.every.unwrap_or_else(every);
            if every.is_zero() {
                return wait.await;
            }
            tokio::select! {
                biased;
                out = &mut wait => return out,
                () = tokio::time::sleep(every) => {}
            }
            let progress = match self.probe.as_mut() {
                Some(probe) => {
                    let asked = tokio::time::timeout(every, probe());
                    tokio::select! {
                        biased;
                        out = &mut wait => return out,
                        r = asked => r.ok().flatten(),
                    }
                }
                None => None,
            };
            let line = self.line(progress.as_deref());
            (self.sink)(&line);
        }
    }

    /// One report.
    fn line(&self, progress: Option<&str>) -> String {
        let mut line = self.what.clone();
        if let Some(p) = progress {
            line.push_str(": ");
            line.push_str(p);
        }
        line.push_str(&format!(
            "; waited {:.1?} of at most {:?}",
            self.started.elapsed(),
            self.limit
        ));
        if let Some(h) = &self.hint {
            line.push_str("; ");
            line.push_str(h);
        }
        line
    }
}

/// Whether this thread's reports go to stderr: no tracing subscriber
/// would show them.
fn to_stderr() -> bool {
    tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>())
}

/// Reports `line`: a tracing event, and a stderr line where no subscriber
/// would show the event.
fn emit(line: &str) {
    tracing::info!(target: "chorus::wait", "{line}");
    if to_stderr() {
        let first = !TOLD_HOW_TO_SILENCE.swap(true, Ordering::Relaxed);
        let how = if first {
            " (CHORUS_WAIT_REPORT_S=0 turns these reports off)"
        } else {
            ""
        };
        // A closed stderr loses the report, nothing else.
        let _ = writeln!(std::io::stderr(), "chorus: {line}{how}");
    }
}

#[cfg(test)]
impl<'a> Waiting<'a> {
    /// Reports every `every`, to `sink`.
    fn to(mut self, every: Duration, sink: impl FnMut(&str) + Send + 'static) -> Waiting<'a> {
        self.every = Some(every);
        self.sink = Box::new(sink);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    /// The wait ends only once three reports came, so the test sees
    /// reports whatever the machine's speed; each says what, where, how
    /// far and how long.
    #[test]
    fn a_long_wait_reports_what_it_waits_for_until_it_ends() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let mut tx = Some(tx);
        let sink = {
            let lines = lines.clone();
            move |l: &str| {
                let mut v = lines.lock().unwrap();
                v.push(l.to_string());
                if v.len() == 3 {
                    let _ = tx.take().unwrap().send(7);
                }
            }
        };
        let mut n = 0;
        let out = rt().block_on(
            Waiting::new(
                "rank 1 waits for the job's 2 ranks to join, through the store at 10.0.0.1:29500",
                Instant::now(),
                Duration::from_secs(300),
            )
            .hint("did every rank start?")
            .progress(move || {
                n += 1;
                async move { Some(format!("{n} of 2 ranks joined")) }
            })
            .to(Duration::from_millis(5), sink)
            .run(async { rx.await.unwrap() }),
        );
        assert_eq!(out, 7);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        for (i, l) in lines.iter().enumerate() {
            assert!(
                l.starts_with(
                    "rank 1 waits for the job's 2 ranks to join, through the store at \
                     10.0.0.1:29500: "
                ),
                "{l}"
            );
            assert!(
                l.contains(&format!(": {} of 2 ranks joined; waited ", i + 1)),
                "{l}"
            );
            assert!(
                l.ends_with(" of at most 300s; did every rank start?"),
                "{l}"
            );
        }
    }

    #[test]
    fn a_wait_that_ends_first_reports_nothing_and_its_result_is_kept() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = {
            let lines = lines.clone();
            move |l: &str| lines.lock().unwrap().push(l.to_string())
        };
        let out = rt().block_on(
            Waiting::new("w", Instant::now(), Duration::from_secs(1))
                .to(Duration::from_secs(3600), sink)
                .run(async { "done" }),
        );
        assert_eq!(out, "done");
        assert!(lines.lock().unwrap().is_empty());
    }

    /// A probe that never answers holds up neither the wait nor the
    /// report: the report goes out without it.
    #[test]
    fn a_hung_probe_is_left_out_of_the_report() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut tx = Some(tx);
        let sink = {
            let lines = lines.clone();
            move |l: &str| {
                lines.lock().unwrap().push(l.to_string());
                if let Some(t) = tx.take() {
                    let _ = t.send(());
                }
            }
        };
        rt().block_on(
            Waiting::new("rank 0 waits", Instant::now(), Duration::from_secs(9))
                .progress(std::future::pending::<Option<String>>)
                .to(Duration::from_millis(5), sink)
                .run(async { rx.await.unwrap() }),
        );
        let l = lines.lock().unwrap()[0].clone();
        assert!(l.starts_with("rank 0 waits; waited "), "{l}");
        assert!(l.ends_with(" of at most 9s"), "{l}");
    }

    #[test]
    fn zero_turns_reports_off() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = {
            let lines = lines.clone();
            move |l: &str| lines.lock().unwrap().push(l.to_string())
        };
        rt().block_on(
            Waiting::new("w", Instant::now(), Duration::from_secs(1))
                .to(Duration::ZERO, sink)
                .run(async { tokio::time::sleep(Duration::from_millis(30)).await }),
        );
        assert!(lines.lock().unwrap().is_empty());
    }

    /// Reports go to stderr only where no subscriber shows them.
    #[test]
    fn stderr_only_without_a_subscriber() {
        assert!(to_stderr());
        let sub = tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(sub, || assert!(!to_stderr()));
        assert!(to_stderr());
    }

    #[test]
    fn the_period_set_wins_over_the_environment_and_zero_is_off() {
        set_every(Duration::from_millis(1500));
        assert_eq!(every(), Duration::from_millis(1500));
        set_every(Duration::ZERO);
        assert_eq!(every(), Duration::ZERO);
        EVERY_MS.store(u64::MAX, Ordering::Relaxed);
    }
}
