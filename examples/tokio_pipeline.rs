//! chorus tokio pipeline: each rank reads records from a TCP socket, batches
//! them, reduces per-batch statistics across ranks and writes the results to
//! a TCP sink; Ctrl-C stops it cleanly, with every record read accounted for.
//!
//! ```text
//! generator ──TCP──▶ reader ──queue──▶ collectives ──queue──▶ writer ──TCP──▶ sink
//!  (task)            (task)  (bounded)  (window of rounds     (task) (bounded)  (task)
//!                                        in flight)
//! ```
//!
//! * The generator (a task of the example) listens on 127.0.0.1 and sends
//!   `seq value` lines at `--rate` records per second.
//! * The reader batches `--batch-size` records and queues the batches.
//! * The main task runs one *round* of collectives per batch: an all_reduce
//!   of (sum, sum of squares, count, stop flag), an all_reduce min, an
//!   all_reduce max and an all_gather of every rank's count. Up to `--window`
//!   rounds are in flight at once (a `FuturesOrdered`); their results are
//!   handed on in order.
//! * The writer sends each round's result to the sink (another task of the
//!   example) and waits for its acknowledgement, with a timeout.
//!
//! Collectives are a global agreement: every rank must run the same rounds.
//! A rank that has no batch within `--idle-ms` sends an empty round, so a
//! silent input cannot stall the others. Ctrl-C sets this rank's stop flag in
//! its next round; the first round whose reduced flag is set is the same on
//! every rank, and every rank stops after round `that + window - 1` (no rank
//! can have submitted more), so all run the same rounds. `--batches N` stops
//! every rank after N rounds instead. At the end each rank prints how many
//! records it read, wrote, and left unwritten (queued or held when it
//! stopped): read == written + unwritten.
//!
//! A Ctrl-C in the terminal reaches the launcher (`chorus-run`, or the one
//! the example starts itself), which forwards SIGINT to every rank; each rank
//! stops as above and exits 0, and the launcher exits 130 (128 + SIGINT)
//! because it was interrupted.
//!
//! `--slow-reduce-ms` delays each round's result (a slow network);
//! `--slow-sink-ms` delays each acknowledgement of the sink (a slow
//! consumer). The stage counters show each stage running ahead of the slow
//! one, up to the bound of the queue between them.
//!
//! ```sh
//! cargo run --release -p chorus-examples --example tokio_pipeline -- --nproc 3 --batches 50
//! cargo run --release -p chorus-examples --example tokio_pipeline -- --nproc 2   # until Ctrl-C
//! ```
#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::{Failed, ProcessGroup, ReduceOp};
use chorus_examples::{launch_self_if_needed, run_rank, BoxError};
use clap::Parser;
use futures::stream::{FuturesOrdered, StreamExt};
use futures::TryFutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::sleep;

#[derive(Parser, Debug, Clone)]
#[command(about = "A tokio pipeline reducing per-batch statistics across ranks")]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// Rounds (one batch per rank each) before stopping; 0 runs until
    /// Ctrl-C (default 0; 20 with --quick).
    #[arg(long)]
    batches: Option<u64>,
    /// Records per batch (default 64; 32 with --quick).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Rounds of collectives in flight at once.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Capacity of each queue between stages (batches, results).
    #[arg(long, default_value_t = 4)]
    queue: usize,
    /// Records per second the generator sends to each rank (0: as fast as
    /// the socket takes them).
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// A round with no batch for this long goes out empty.
    #[arg(long, default_value_t = 200)]
    idle_ms: u64,
    /// The sink takes this long to acknowledge each result.
    #[arg(long, default_value_t = 0)]
    slow_sink_ms: u64,
    /// Each round's result arrives this much later (a slow collective).
    #[arg(long, default_value_t = 0)]
    slow_reduce_ms: u64,
    /// The writer gives up on a result the sink has not acknowledged in
    /// this time.
    #[arg(long, default_value_t = 5_000)]
    ack_timeout_ms: u64,
    /// Generator port of rank 0 (rank r listens on port + r; 0: any free port).
    #[arg(long, default_value_t = 0)]
    gen_port: u16,
    /// Sink port of rank 0 (rank r listens on port + r; 0: any free port).
    #[arg(long, default_value_t = 0)]
    sink_port: u16,
    /// Rank 0 prints a round's result every this many rounds (0: never).
    #[arg(long, default_value_t = 10)]
    print_every: u64,
    /// Rank 0 prints the stage counters this often (0: never).
    #[arg(long, default_value_t = 1000)]
    report_ms: u64,
    /// Small, short run (for CI).
    #[arg(long)]
    quick: bool,
}

/// The run's settings after `--quick` defaults.
#[derive(Debug, Clone, Copy)]
struct Config {
    batches: u64,
    batch_size: usize,
    window: usize,
    queue: usize,
    rate: u64,
    idle: Duration,
    slow_sink: Duration,
    slow_reduce: Duration,
    ack_timeout: Duration,
    gen_port: u16,
    sink_port: u16,
    print_every: u64,
    report: Duration,
}

impl Config {
    fn from_args(a: &Args) -> Result<Config, String> {
        let c = Config {
            batches: a.batches.unwrap_or(if a.quick { 20 } else { 0 }),
            batch_size: a.batch_size.unwrap_or(if a.quick { 32 } else { 64 }),
            window: a.window,
            queue: a.queue,
            rate: a.rate,
            idle: Duration::from_millis(a.idle_ms),
            slow_sink: Duration::from_millis(a.slow_sink_ms),
            slow_reduce: Duration::from_millis(a.slow_reduce_ms),
            ack_timeout: Duration::from_millis(a.ack_timeout_ms),
            gen_port: a.gen_port,
            sink_port: a.sink_port,
            print_every: a.print_every,
            report: Duration::from_millis(a.report_ms),
        };
        if c.batch_size == 0 || c.window == 0 || c.queue == 0 {
            return Err("--batch-size, --window and --queue must be at least 1".into());
        }
        if c.idle.is_zero() || c.ack_timeout.is_zero() {
            return Err("--idle-ms and --ack-timeout-ms must be above 0".into());
        }
        Ok(c)
    }
}

/// Per-stage counters of one rank (shared by its tasks).
#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    read: AtomicU64,
    queued: AtomicU64,
    taken: AtomicU64,
    submitted: AtomicU64,
    reduced: AtomicU64,
    written: AtomicU64,
    max_reader_lead: AtomicU64,
    max_in_flight: AtomicU64,
    max_sink_lead: AtomicU64,
    reader_blocked_us: AtomicU64,
    reducer_blocked_us: AtomicU64,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn add(a: &AtomicU64, v: u64) -> u64 {
    a.fetch_add(v, Ordering::Relaxed) + v
}

/// A batch of records read by one rank.
struct Batch {
    values: Vec<f64>,
}

/// The result of one round, as every rank sees it.
#[derive(Debug, Clone)]
struct RoundResult {
    round: u64,
    /// Records this rank contributed.
    mine: u64,
    /// Records of every rank, by rank (the all_gather).
    counts: Vec<i64>,
    total: f64,
    sum: f64,
    sumsq: f64,
    min: f64,
    max: f64,
    /// Sum of the ranks' stop flags.
    stop: f64,
}

impl RoundResult {
    fn line(&self) -> String {
        if self.total == 0.0 {
            return format!("round {}: no records from {:?}", self.round, self.counts);
        }
        let mean = self.sum / self.total;
        let sd = (self.sumsq / self.total - mean * mean).max(0.0).sqrt();
        format!(
            "round {}: {} records from {:?}, mean {mean:+.4}, sd {sd:.4}, min {:+.3}, max {:+.3}",
            self.round, self.total, self.counts, self.min, self.max
        )
    }
}

/// Listens on 127.0.0.1:`port` (0: any free port).
async fn listen(port: u16, what: &str) -> Result<TcpListener, BoxError> {
    TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port} for the {what}: {e}").into())
}

/// Waits until `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&v| v).await;
}

/// The generator: sends `seq value` lines to the one reader that connects,
/// `rate` records per second, until told to stop or the reader hangs up.
/// Returns the records it handed to the socket.
async fn generator(
    listener: TcpListener,
    seed: u64,
    rate: u64,
    mut stop: watch::Receiver<bool>,
    c: Arc<Counters>,
) -> Result<u64, BoxError> {
    let mut sock = tokio::select! {
        r = listener.accept() => r?.0,
        _ = stopped(&mut stop) => return Ok(0),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let tick = Duration::from_millis(5);
    let per_tick = if rate == 0 {
        256
    } else {
        (rate * tick.as_millis() as u64 / 1000).max(1)
    };
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seq, mut chunk) = (0u64, String::new());
    loop {
        if rate > 0 {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                _ = ticker.tick() => {}
            }
        }
        chunk.clear();
        for _ in 0..per_tick {
            // Roughly normal: the sum of four uniforms, centred.
            let v: f64 = (0..4).map(|_| rng.gen::<f64>()).sum::<f64>() - 2.0;
            chunk.push_str(&format!("{seq} {v:.6}\n"));
            seq += 1;
        }
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            r = sock.write_all(chunk.as_bytes()) => {
                if r.is_err() {
                    break; // the reader hung up
                }
                add(&c.sent, per_tick);
            }
        }
    }
    Ok(get(&c.sent))
}

/// What the reader held when it stopped.
struct ReaderReport {
    /// Records read but never queued (a partial batch, or a full one that
    /// was waiting for room in the queue).
    held: u64,
    /// The input ended (the generator hung up).
    eof: bool,
}

/// The reader: reads `seq value` lines, batches them and queues the batches
/// (waiting for room), until told to stop or the input ends.
async fn reader(
    addr: std::net::SocketAddr,
    batch_size: usize,
    tx: mpsc::Sender<Batch>,
    mut stop: watch::Receiver<bool>,
    c: Arc<Counters>,
) -> Result<ReaderReport, BoxError> {
    let sock = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("reader cannot connect to the generator at {addr}: {e}"))?;
    let mut lines = BufReader::new(sock).lines();
    let mut cur: Vec<f64> = Vec::with_capacity(batch_size);
    let mut expect = 0u64;
    loop {
        if cur.len() == batch_size {
            let t = Instant::now();
            // `reserve` is cancel safe: if stop wins, the batch stays here
            // and is reported, never dropped.
            let permit = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                p = tx.reserve() => match p {
                    Ok(p) => p,
                    Err(_) => break, // the pipeline is gone
                },
            };
            add(&c.reader_blocked_us, t.elapsed().as_micros() as u64);
            permit.send(Batch {
                values: std::mem::replace(&mut cur, Vec::with_capacity(batch_size)),
            });
            let lead = add(&c.queued, 1) - get(&c.taken);
            c.max_reader_lead.fetch_max(lead, Ordering::Relaxed);
            continue;
        }
        // `next_line` is cancel safe: a line is either returned or left in
        // the buffer.
        let line = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            l = lines.next_line() => l?,
        };
        let Some(line) = line else {
            return Ok(ReaderReport {
                held: cur.len() as u64,
                eof: true,
            });
        };
        let (seq, value) = line
            .split_once(' ')
            .and_then(|(s, v)| Some((s.parse::<u64>().ok()?, v.parse::<f64>().ok()?)))
            .ok_or_else(|| format!("bad record {line:?} (expected `seq value`)"))?;
        if seq != expect {
            return Err(format!("record {expect} missing: the next one read is {seq}").into());
        }
        expect += 1;
        add(&c.read, 1);
        cur.push(value);
    }
    Ok(ReaderReport {
        held: cur.len() as u64,
        eof: false,
    })
}

/// The sink: acknowledges each result line with `ok <round>` after
/// `slow`, until the writer hangs up. Returns the results it received.
async fn sink(listener: TcpListener, slow: Duration) -> Result<u64, BoxError> {
    let (sock, _) = listener.accept().await?;
    let (rd, mut wr) = sock.into_split();
    let mut lines = BufReader::new(rd).lines();
    let mut received = 0u64;
    while let Some(line) = lines.next_line().await? {
        received += 1;
        if !slow.is_zero() {
            sleep(slow).await;
        }
        let round = line
            .strip_prefix("round ")
            .and_then(|r| r.split(':').next())
            .unwrap_or("?");
        wr.write_all(format!("ok {round}\n").as_bytes()).await?;
    }
    Ok(received)
}

/// What the writer did.
#[derive(Default)]
struct WriterReport {
    results: u64,
    records: u64,
    /// Results (and this rank's records in them) reduced but not written.
    unwritten_results: u64,
    unwritten_records: u64,
    error: Option<String>,
}

/// The writer: sends each result to the sink and waits for its
/// acknowledgement (with a timeout). After an error it keeps draining the
/// queue, counting what it could not write.
async fn writer(
    addr: std::net::SocketAddr,
    mut rx: mpsc::Receiver<RoundResult>,
    ack_timeout: Duration,
    c: Arc<Counters>,
) -> WriterReport {
    let mut rep = WriterReport::default();
    let conn = TcpStream::connect(addr).await;
    let mut io = match conn {
        Ok(sock) => {
            let (rd, wr) = sock.into_split();
            Some((BufReader::new(rd).lines(), wr))
        }
        Err(e) => {
            rep.error = Some(format!("cannot connect to the sink at {addr}: {e}"));
            None
        }
    };
    while let Some(r) = rx.recv().await {
        let Some((acks, wr)) = io.as_mut() else {
            rep.unwritten_results += 1;
            rep.unwritten_records += r.mine;
            continue;
        };
        let outcome: Result<(), String> = async {
            wr.write_all(format!("{}\n", r.line()).as_bytes())
                .await
                .map_err(|e| format!("write to the sink failed: {e}"))?;
            let ack = tokio::select! {
                a = acks.next_line() => a.map_err(|e| format!("reading the sink's ack failed: {e}"))?,
                _ = sleep(ack_timeout) => {
                    return Err(format!("the sink did not acknowledge round {} within {ack_timeout:?}", r.round));
                }
            };
            match ack {
                Some(a) if a == format!("ok {}", r.round) => Ok(()),
                other => Err(format!("unexpected ack {other:?} for round {}", r.round)),
            }
        }
        .await;
        match outcome {
            Ok(()) => {
                rep.results += 1;
                rep.records += r.mine;
                add(&c.written, 1);
            }
            Err(e) => {
                rep.error = Some(e);
                rep.unwritten_results += 1;
                rep.unwritten_records += r.mine;
                io = None;
            }
        }
    }
    if let Some((_, mut wr)) = io {
        let _ = wr.shutdown().await;
    }
    rep
}

/// Submits round `round`'s collectives for `batch` and returns the future
/// of its result. Every rank submits the same four collectives per round.
fn submit_round(
    pg: &ProcessGroup,
    round: u64,
    batch: Option<Batch>,
    stop: bool,
    slow: Duration,
) -> Result<impl std::future::Future<Output = Result<RoundResult, BoxError>>, BoxError> {
    let values = batch.map(|b| b.values).unwrap_or_default();
    let n = values.len() as f64;
    let sum: f64 = values.iter().sum();
    let sumsq: f64 = values.iter().map(|v| v * v).sum();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let flag = if stop { 1.0 } else { 0.0 };
    let sums = pg.all_reduce(vec![sum, sumsq, n, flag], ReduceOp::Sum)?;
    let mins = pg.all_reduce(vec![min], ReduceOp::Min)?;
    let maxs = pg.all_reduce(vec![max], ReduceOp::Max)?;
    let counts = pg.all_gather(vec![values.len() as i64], vec![0i64; pg.size()])?;
    let mine = values.len() as u64;
    Ok(async move {
        // The works fail with their own buffers (`Failed<B>`, one type per
        // op); without them the errors join as one `WorkError`.
        let (s, mn, mx, (_, counts)) = tokio::try_join!(
            sums.map_err(Failed::into_error),
            mins.map_err(Failed::into_error),
            maxs.map_err(Failed::into_error),
            counts.map_err(Failed::into_error)
        )?;
        if !slow.is_zero() {
            sleep(slow).await;
        }
        Ok(RoundResult {
            round,
            mine,
            counts,
            sum: s[0],
            sumsq: s[1],
            total: s[2],
            stop: s[3],
            min: mn[0],
            max: mx[0],
        })
    })
}

/// Why the ranks stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StopReason {
    Batches,
    Agreed,
}

async fn run(pg: &ProcessGroup, cfg: Config) -> Result<bool, BoxError> {
    let (rank, world) = (pg.rank(), pg.size());
    let c = Arc::new(Counters::default());
    let port = |base: u16| {
        if base == 0 {
            0
        } else {
            base.saturating_add(rank as u16)
        }
    };
    let gen_listener = listen(port(cfg.gen_port), "generator").await?;
    let sink_listener = listen(port(cfg.sink_port), "sink").await?;
    let (gen_addr, sink_addr) = (gen_listener.local_addr()?, sink_listener.local_addr()?);
    println!(
        "rank {rank}: pid {}, generator {gen_addr}, sink {sink_addr}",
        std::process::id()
    );

    // Ctrl-C sets this rank's stop flag (and stops its reader).
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ctrlc_tx, mut ctrlc_rx) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = ctrlc_tx.send(true);
        }
    });

    let generator = tokio::spawn(generator(
        gen_listener,
        rank as u64 + 1,
        cfg.rate,
        stop_rx.clone(),
        c.clone(),
    ));
    let sink = tokio::spawn(sink(sink_listener, cfg.slow_sink));
    let (in_tx, mut in_rx) = mpsc::channel::<Batch>(cfg.queue);
    let reader = tokio::spawn(reader(
        gen_addr,
        cfg.batch_size,
        in_tx,
        stop_rx.clone(),
        c.clone(),
    ));
    let (out_tx, out_rx) = mpsc::channel::<RoundResult>(cfg.queue);
    let writer = tokio::spawn(writer(sink_addr, out_rx, cfg.ack_timeout, c.clone()));

    let start = Instant::now();
    if rank == 0 {
        println!(
            "tokio pipeline: {world} ranks, backend {}, batch {} records, window {} rounds (4 collectives each), queues {}, {}",
            pg.backend_name(),
            cfg.batch_size,
            cfg.window,
            cfg.queue,
            if cfg.batches == 0 {
                "until Ctrl-C".to_string()
            } else {
                format!("{} rounds", cfg.batches)
            }
        );
        if !cfg.report.is_zero() {
            let c = c.clone();
            let every = cfg.report;
            tokio::spawn(async move {
                let mut t = tokio::time::interval(every);
                t.tick().await;
                loop {
                    t.tick().await;
                    println!(
                        "[{:6.1} s] read {} records, queued {} batches, reduced {} rounds ({} in flight), written {}",
                        start.elapsed().as_secs_f64(),
                        get(&c.read),
                        get(&c.queued),
                        get(&c.reduced),
                        get(&c.submitted) - get(&c.reduced),
                        get(&c.written)
                    );
                }
            });
        }
    }

    // The collective stage.
    let mut win = Window {
        rounds: FuturesOrdered::new(),
        next: 0,
        records: 0,
    };
    // Last round every rank runs, once known.
    let mut last: Option<u64> = cfg.batches.checked_sub(1);
    let mut reason = StopReason::Batches;
    let mut local_stop = false;
    let mut input_open = true;
    let mut agreed = false;
    let mut idle_rounds = 0u64;
    let mut totals = (0.0f64, 0.0f64, f64::INFINITY, f64::NEG_INFINITY); // count, sum, min, max
    let mut idle_deadline = tokio::time::Instant::now() + cfg.idle;
    loop {
        let more = last.is_none_or(|l| win.next <= l);
        if !more && win.rounds.is_empty() {
            break;
        }
        let room = more && win.rounds.len() < cfg.window;
        let flag = local_stop || !input_open;
        // Stopping: submit at once with whatever is queued (or nothing).
        if room && (flag || agreed) {
            let batch = in_rx.try_recv().ok();
            win.submit(pg, batch, flag, &cfg, &c)?;
            if last.is_some_and(|l| win.next > l) {
                let _ = stop_tx.send(true);
            }
            continue;
        }
        tokio::select! {
            biased;
            Some(res) = win.rounds.next(), if !win.rounds.is_empty() => {
                let r: RoundResult = res?;
                add(&c.reduced, 1);
                if r.stop > 0.0 && !agreed {
                    agreed = true;
                    let stop_at = r.round + cfg.window as u64 - 1;
                    if last.is_none_or(|l| stop_at < l) {
                        last = Some(stop_at);
                        reason = StopReason::Agreed;
                    }
                    let _ = stop_tx.send(true);
                }
                if r.total > 0.0 {
                    totals.0 += r.total;
                    totals.1 += r.sum;
                    totals.2 = totals.2.min(r.min);
                    totals.3 = totals.3.max(r.max);
                }
                if rank == 0 && cfg.print_every > 0 && r.round % cfg.print_every == 0 {
                    println!("{}", r.line());
                }
                // Blocks only when the writer's queue is full.
                let t = Instant::now();
                if out_tx.send(r).await.is_err() {
                    return Err("the writer stopped early".into());
                }
                add(&c.reducer_blocked_us, t.elapsed().as_micros() as u64);
                let lead = get(&c.reduced) - get(&c.written);
                c.max_sink_lead.fetch_max(lead, Ordering::Relaxed);
            }
            _ = ctrlc_rx.wait_for(|&v| v), if !local_stop => {
                local_stop = true;
                match last {
                    Some(l) if win.next > l => println!(
                        "rank {rank}: Ctrl-C: already stopping after round {l}"
                    ),
                    _ => println!(
                        "rank {rank}: Ctrl-C: raising the stop flag (rounds from {} on carry it)",
                        win.next
                    ),
                }
                let _ = stop_tx.send(true);
            }
            b = in_rx.recv(), if room && input_open => {
                match b {
                    Some(batch) => win.submit(pg, Some(batch), false, &cfg, &c)?,
                    None => input_open = false,
                }
                idle_deadline = tokio::time::Instant::now() + cfg.idle;
            }
            _ = tokio::time::sleep_until(idle_deadline), if room => {
                idle_rounds += 1;
                win.submit(pg, None, false, &cfg, &c)?;
                idle_deadline = tokio::time::Instant::now() + cfg.idle;
            }
        }
        if last.is_some_and(|l| win.next > l) {
            let _ = stop_tx.send(true);
        }
    }
    let rounds = win.next;
    let reduced_records = win.records;
    let elapsed = start.elapsed();

    // Shut down: the reader stops (it was told), what it queued and did
    // not get reduced is counted, then the writer drains and closes.
    let _ = stop_tx.send(true);
    let rrep = reader.await??;
    let mut queued_batches = 0u64;
    let mut queued_records = 0u64;
    while let Some(b) = in_rx.recv().await {
        queued_batches += 1;
        queued_records += b.values.len() as u64;
    }
    drop(out_tx);
    let wrep = writer.await?;
    let sent = generator.await??;
    let received = sink.await??;

    let read = get(&c.read);
    let unwritten = wrep.unwritten_records + queued_records + rrep.held;
    let balanced = read == wrep.records + unwritten
        && wrep.records == reduced_records - wrep.unwritten_records;
    let sink_ok = received == wrep.results;
    println!(
        "rank {rank}: read {read} = written {} + unwritten {unwritten} (reduced but not written {}, queued {queued_batches} batches {queued_records}, held by the reader {}): {}",
        wrep.records,
        wrep.unwritten_records,
        rrep.held,
        if balanced { "OK" } else { "MISMATCH" }
    );
    println!(
        "rank {rank}: {rounds} rounds ({idle_rounds} idle), {} results written, sink received {received}: {}; generator sent {sent}, {} left unread in the socket{}{}",
        wrep.results,
        if sink_ok { "OK" } else { "MISMATCH" },
        sent.saturating_sub(read),
        if rrep.eof { "; the input ended" } else { "" },
        wrep.error.as_deref().map(|e| format!("; writer error: {e}")).unwrap_or_default(),
    );
    println!(
        "rank {rank}: stages: reader ran up to {} batches ahead of the collectives (queue {}), blocked {:.1} ms on a full queue; up to {} rounds in flight (window {}); collectives ran up to {} results ahead of the sink (queue {} + 1 being written), blocked {:.1} ms on a full queue",
        get(&c.max_reader_lead),
        cfg.queue,
        get(&c.reader_blocked_us) as f64 / 1e3,
        get(&c.max_in_flight),
        cfg.window,
        get(&c.max_sink_lead),
        cfg.queue,
        get(&c.reducer_blocked_us) as f64 / 1e3,
    );

    // Every rank's accounting, gathered for rank 0's summary.
    let mine = vec![
        rounds as i64,
        read as i64,
        wrep.records as i64,
        unwritten as i64,
        (balanced && sink_ok) as i64,
    ];
    let (_, all) = pg.all_gather(mine, vec![0i64; 5 * world])?.await?;
    let all_ok = all.chunks(5).all(|r| r[4] == 1 && r[0] == rounds as i64);
    if rank == 0 {
        let (n, sum, min, max) = totals;
        println!(
            "all {world} ranks: {rounds} rounds each, stopped after round {} ({}), in {:.0} ms ({:.0} rounds/s); {n} records reduced, mean {:+.4}, min {:+.3}, max {:+.3}",
            rounds.saturating_sub(1),
            match reason {
                StopReason::Batches => "--batches",
                StopReason::Agreed => "stop flag agreed through all_reduce",
            },
            elapsed.as_secs_f64() * 1e3,
            rounds as f64 / elapsed.as_secs_f64().max(1e-9),
            if n > 0.0 { sum / n } else { 0.0 },
            min,
            max,
        );
        let read: i64 = all.chunks(5).map(|r| r[1]).sum();
        let written: i64 = all.chunks(5).map(|r| r[2]).sum();
        let unwritten: i64 = all.chunks(5).map(|r| r[3]).sum();
        println!(
            "all {world} ranks: read {read} = written {written} + unwritten {unwritten}, every rank balanced: {}",
            if all_ok { "OK" } else { "FAIL" }
        );
    }
    Ok(all_ok)
}

/// A round's result, on its way.
type RoundFuture = Pin<Box<dyn Future<Output = Result<RoundResult, BoxError>> + Send>>;

/// The rounds in flight, oldest first.
struct Window {
    rounds: FuturesOrdered<RoundFuture>,
    /// Number of the next round.
    next: u64,
    /// Records of this rank submitted so far.
    records: u64,
}

impl Window {
    /// Submits the next round (its collectives start now) and puts its
    /// future in the window.
    fn submit(
        &mut self,
        pg: &ProcessGroup,
        batch: Option<Batch>,
        stop: bool,
        cfg: &Config,
        c: &Counters,
    ) -> Result<(), BoxError> {
        if batch.is_some() {
            add(&c.taken, 1);
        }
        self.records += batch.as_ref().map_or(0, |b| b.values.len() as u64);
        let fut = submit_round(pg, self.next, batch, stop, cfg.slow_reduce)?;
        self.rounds.push_back(Box::pin(fut));
        self.next += 1;
        add(&c.submitted, 1);
        c.max_in_flight
            .fetch_max(self.rounds.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match Config::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tokio_pipeline: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(code) = launch_self_if_needed(args.nproc) {
        return code;
    }
    let result = run_rank(
        Duration::from_secs(60),
        |pg| async move { run(&pg, cfg).await },
    );
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("tokio_pipeline failed: {e}");
            ExitCode::FAILURE
        }
    }
}
