//! The parent process: serves the store, starts the children, signals the
//! phases through keys under `bench/`, and measures.

use std::process::{Child, Command};

use std::time::{Duration, Instant};

use chorus::store::ServerStats;

use crate::host::Host;
use crate::{unix_ms, Args};

/// Kills the children it holds when dropped (a failed phase included).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The liveness period of a timeout (as chorus computes it).
fn period(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(300))
}

pub(crate) fn run(args: &Args) -> Result<(), String> {
    let h = chorus_store::rt::handle()?;
    h.block_on(measure(args.clone()))
}

async fn measure(args: Args) -> Result<(), String> {
    let n = args.ranks;
    let phase = Duration::from_secs(args.phase_timeout_s);
    let (server, addr) = Host::start(args.torch.as_deref()).await?;
    let ctl = crate::child::control(&addr, args.torch.is_some())
        .await
        .map_err(|e| format!("control connection: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut children = Children(Vec::new());
    for i in 0..args.procs {
        let c = Command::new(&exe)
            .args(["--child", &i.to_string(), "--addr", &addr])
            .args([
                "--ranks",
                &n.to_string(),
                "--procs",
                &args.procs.to_string(),
            ])
            .args(["--liveness-ms", &args.liveness_ms.to_string()])
            .args(["--window-ms", &args.window_ms.to_string()])
            .args(["--phase-timeout-s", &args.phase_timeout_s.to_string()])
            .args(args.torch.iter().flat_map(|p| ["--torch", p.as_str()]))
            .spawn()
            .map_err(|e| format!("child {i}: {e}"))?;
        children.0.push(c);
    }
    let wait = |key: &'static str| {
        let ctl = ctl.clone();
        async move {
            ctl.get(key, phase)
                .await
                .map_err(|e| format!("phase {key} did not finish within {phase:?}: {e}"))
        }
    };
    wait("bench/ready_all").await?;

    // Form.
    let t_go = Instant::now();
    let s_go = server.stats();
    ctl.set("bench/go", unix_ms().to_string().as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    wait("bench/formed_all").await?;
    let form = t_go.elapsed();
    let s_formed = server.stats().since(&s_go);
    println!(
        "form: {n} ranks in {} processes formed the group in {:.0} ms ({:.1} store requests per rank)",
        args.procs,
        form.as_secs_f64() * 1e3,
        s_formed.requests as f64 / n as f64
    );

    // Steady state.
    let timeout = Duration::from_millis(args.liveness_ms);
    let p = period(timeout);
    tokio::time::sleep(p * 3).await;
    let (s0, c0, t0) = (server.stats(), server.cpu(), Instant::now());
    tokio::time::sleep(p * args.periods).await;
    let (s1, c1, t1) = (server.stats(), server.cpu(), Instant::now());
    let d: ServerStats = s1.since(&s0);
    let periods = (t1 - t0).as_secs_f64() / p.as_secs_f64();
    let per = |x: f64| x / periods;
    let req = per(d.requests as f64) / n as f64;
    let bytes = per((d.bytes_in + d.bytes_out) as f64) / n as f64;
    let busy_ms = per(d.busy.as_secs_f64() * 1e3);
    let cpu_ms = per((c1 - c0).as_secs_f64() * 1e3);
    println!(
        "steady: period {p:?}: {req:.2} store requests and {bytes:.0} bytes per rank per period; \
         the store answers a period's requests in {busy_ms:.1} ms of busy time, {cpu_ms:.1} ms of \
         its process's CPU"
    );

    // Stop one rank (the middle one) and time every other rank's verdict.
    let victim = n / 2;
    let t_stop = unix_ms();
    ctl.set("bench/stop", format!("{victim} {t_stop}").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    wait("bench/detected_all").await?;
    let (mut found, mut wrong, mut detect_ms) = (0usize, 0usize, 0u64);
    for i in 0..args.procs {
        let v = ctl
            .get(&format!("bench/detected/{i}"), phase)
            .await
            .map_err(|e| e.to_string())?;
        let v = String::from_utf8_lossy(&v).into_owned();
        let f: Vec<u64> = v.split(' ').filter_map(|x| x.parse().ok()).collect();
        if let [a, b, c] = f[..] {
            found += a as usize;
            wrong += b as usize;
            detect_ms = detect_ms.max(c);
        }
    }
    println!(
        "detect: rank {victim} stopped; {found} of {} ranks failed their pending work ({wrong} not \
         with PeerSilent naming it), the last {detect_ms} ms after the stop (liveness timeout {} ms)",
        n - 1,
        args.liveness_ms
    );

    // Re-form.
    wait("bench/reformed_all").await?;
    let (mut done, mut failed, mut reform_ms) = (0usize, 0usize, 0u64);
    for i in 0..args.procs {
        let v = ctl
            .get(&format!("bench/reformed/{i}"), phase)
            .await
            .map_err(|e| e.to_string())?;
        let v = String::from_utf8_lossy(&v).into_owned();
        let f: Vec<u64> = v.split(' ').filter_map(|x| x.parse().ok()).collect();
        if let [a, b, c] = f[..] {
            done += a as usize;
            failed += b as usize;
            reform_ms = reform_ms.max(c);
        }
    }
    println!(
        "re-form: {done} of {} survivors re-formed without rank {victim} ({failed} failed), the \
         last {reform_ms} ms after the stop (window {} ms)",
        n - 1,
        args.window_ms
    );
    let json = serde_json::json!({"control_plane": {
        "store": if args.torch.is_some() { "torch TCPStore (libuv)" } else { "chorus" },
        "ranks": n, "procs": args.procs, "liveness_ms": args.liveness_ms,
        "window_ms": args.window_ms, "period_ms": p.as_millis() as u64,
        "form_ms": form.as_secs_f64() * 1e3,
        "form_requests_per_rank": s_formed.requests as f64 / n as f64,
        "steady_requests_per_rank_period": req,
        "steady_bytes_per_rank_period": bytes,
        "steady_store_busy_ms_per_period": busy_ms,
        "steady_store_cpu_ms_per_period": cpu_ms,
        "detect_found": found, "detect_wrong": wrong, "detect_ms": detect_ms,
        "reformed": done, "reform_failed": failed, "reform_ms": reform_ms,
    }});
    println!("{json}");
    ctl.set("bench/done", b"1")
        .await
        .map_err(|e| e.to_string())?;
    let ok = found == n - 1 && wrong == 0 && done == n - 1 && failed == 0;
    for c in &mut children.0 {
        let _ = c.wait();
    }
    children.0.clear();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "not every rank got there: {found} detected ({wrong} wrongly), {done} re-formed ({failed} failed) of {}",
            n - 1
        ))
    }
}
