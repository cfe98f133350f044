"""PyTorch ProcessGroupNCCL, world size 1: how late the host learns that a
long op ended, and at what CPU cost; the side of benches/src/bin/wake_probe.rs
it is compared with (run both in one call).

Each sample: torch.cuda._sleep for a calibrated length on the current
stream, then all_reduce(async_op=True), then
  * default:  work.wait() + torch.cuda.current_stream().synchronize()
    (wait() only orders the stream; the synchronize spins the host),
  * --blocking (TORCH_NCCL_BLOCKING_WAIT=1, set before init): work.wait(),
    which blocks the host until the op is done.
Latency ("crude", as wake_probe's crude column): host time from before the
sleep's launch to the wait's return, minus the sleep's GPU length (measured
with CUDA events over the same calibration, converted to host time at the
rate the GPU's clock shows against the host's over two long sleeps). CPU: the process's user +
system time over the samples divided by their wall time, and per op.

Patterns (--patterns), as wake_probe's: `fixed` (each length of
--lengths-us in a cell of its own), `random` (lengths log-uniform from 0.1
to 30 ms, the same sequence as wake_probe's, reported by band) and
`rising` (steps of 1, 3, 7 and 20 ms, reported by length); the varying
ones after 20 warm-up samples drawn at random. Their GPU lengths come from
a line fitted to the sleep's event-timed length at 1 and 20 ms.
"""

import argparse
import os
import resource
import time


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


RISING_US = [1000, 3000, 7000, 20000]
BANDS_US = [100, 300, 1000, 3000, 10000, 30001]


def random_lengths(n, seed):
    """Lengths in us, log-uniform from 0.1 to 30 ms by xorshift64 from
    `seed`: the same sequence as wake_probe's `random_lengths`."""
    x, m, out = max(seed, 1), (1 << 64) - 1, []
    for _ in range(n):
        x ^= (x << 13) & m
        x ^= x >> 7
        x ^= (x << 17) & m
        u = (x >> 11) / float(1 << 53)
        out.append(int(100.0 * 300.0**u))
    return out


def rising_lengths(per_step, cycles):
    return [us for _ in range(cycles) for us in RISING_US for _ in range(per_step)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--lengths-us", default="100,1000,3000,10000,30000")
    ap.add_argument("--blocking", action="store_true")
    ap.add_argument("--patterns", default="fixed")
    ap.add_argument("--random-samples", type=int, default=200)
    ap.add_argument("--rising-samples", type=int, default=12)
    ap.add_argument("--rising-cycles", type=int, default=3)
    a = ap.parse_args()
    if a.blocking:
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534" if a.blocking else "29535")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.ones(256, device="cuda")
    for _ in range(200):
        dist.all_reduce(t, async_op=True).wait()
    torch.cuda.synchronize()

    # Cycles per microsecond of torch.cuda._sleep, from CUDA events.
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 10_000_000
    rates = []
    for _ in range(5):
        s.record()
        torch.cuda._sleep(probe)
        e.record()
        e.synchronize()
        rates.append(probe / (s.elapsed_time(e) * 1000.0))
    rate = sorted(rates)[len(rates) // 2]

    # The GPU clock's rate against the host's (events time the sleeps on
    # the GPU's clock): two sleeps timed both ways, the longer less the
    # shorter, so the launch and the synchronize cancel out.
    def timed(cycles):
        t0 = time.perf_counter()
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        e.synchronize()
        return (time.perf_counter() - t0) * 1e6, s.elapsed_time(e) * 1000.0

    ratios = []
    for _ in range(3):
        (h1, g1), (h2, g2) = timed(int(100_000 * rate)), timed(int(600_000 * rate))
        ratios.append((h2 - h1) / (g2 - g1))
    host_per_gpu = sorted(ratios)[len(ratios) // 2]
    print(f"pytorch GPU clock {(1.0 / host_per_gpu - 1.0) * 1e6:+.1f} ppm against the host's")

    mode = "blocking wait" if a.blocking else "wait+synchronize"

    def sleep_gpu_us(cycles):
        """The sleep's real GPU length for this cycle count, us (median of 5)."""
        lens = []
        for _ in range(5):
            s.record()
            torch.cuda._sleep(cycles)
            e.record()
            e.synchronize()
            lens.append(s.elapsed_time(e) * 1000.0)
        return sorted(lens)[len(lens) // 2]

    def one(cycles):
        """One sample: host us from before the sleep's launch to the wait's return."""
        t0 = time.perf_counter()
        torch.cuda._sleep(cycles)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        if not a.blocking:
            torch.cuda.current_stream().synchronize()
        return (time.perf_counter() - t0) * 1e6

    def report(label, lat, n_all, cpu, wall):
        print(
            f"pytorch {mode:<17} {label:>16}: crude median {pct(lat, 0.5):8.2f} us"
            f"  p99 {pct(lat, 0.99):8.2f} us  max {max(lat):8.2f} us; CPU {100.0 * cpu / wall:5.1f}% of a core,"
            f" {1e6 * cpu / n_all:6.1f} us per op ({len(lat)} samples)"
        )

    for pattern in a.patterns.split(","):
        if pattern == "fixed":
            for us in [int(x) for x in a.lengths_us.split(",")]:
                cycles = int(us * rate)
                # In host time.
                gpu_us = sleep_gpu_us(cycles) * host_per_gpu
                n = a.samples // 2 if us >= 10_000 else a.samples
                r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                lat = [one(cycles) - gpu_us for _ in range(max(n, 10))]
                r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
                report(f"{us:>6} us op", lat, len(lat), cpu, w1 - w0)
            continue
        # The sleep's GPU length as a line in its cycle count.
        c1, c2 = int(1000 * rate), int(20000 * rate)
        g1, g2 = sleep_gpu_us(c1), sleep_gpu_us(c2)
        slope = (g2 - g1) / (c2 - c1)
        for us in random_lengths(20, 7):
            one(int(us * rate))
        lens = (
            random_lengths(a.random_samples, 1)
            if pattern == "random"
            else rising_lengths(a.rising_samples, a.rising_cycles)
        )
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        lat = []
        for us in lens:
            cycles = int(us * rate)
            gpu_us = (g1 + slope * (cycles - c1)) * host_per_gpu
            lat.append(one(cycles) - gpu_us)
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        if pattern == "random":
            groups = [
                (f"random {lo / 1e3:g}-{min(hi, 30000) / 1e3:g} ms", [l for us, l in zip(lens, lat) if lo <= us < hi])
                for lo, hi in zip(BANDS_US, BANDS_US[1:])
            ]
        else:
            groups = [(f"rising {us // 1000} ms", [l for u, l in zip(lens, lat) if u == us]) for us in RISING_US]
        for label, g in groups:
            if g:
                report(label, g, len(lat), cpu, w1 - w0)
        report(f"{pattern} all", lat, len(lat), cpu, w1 - w0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
