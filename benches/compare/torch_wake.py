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
"""

import argparse
import os
import resource
import time


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--lengths-us", default="100,1000,3000,10000,30000")
    ap.add_argument("--blocking", action="store_true")
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
    for us in [int(x) for x in a.lengths_us.split(",")]:
        cycles = int(us * rate)
        # The sleep's real GPU length for this cycle count.
        lens = []
        for _ in range(5):
            s.record()
            torch.cuda._sleep(cycles)
            e.record()
            e.synchronize()
            lens.append(s.elapsed_time(e) * 1000.0)
        # In host time.
        gpu_us = sorted(lens)[len(lens) // 2] * host_per_gpu
        n = a.samples // 2 if us >= 10_000 else a.samples
        lat = []
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(max(n, 10)):
            t0 = time.perf_counter()
            torch.cuda._sleep(cycles)
            w = dist.all_reduce(t, async_op=True)
            w.wait()
            if not a.blocking:
                torch.cuda.current_stream().synchronize()
            lat.append((time.perf_counter() - t0) * 1e6 - gpu_us)
        r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        print(
            f"pytorch {mode:<17} {us:>6} us op (GPU {gpu_us:8.1f} us): crude median {pct(lat, 0.5):8.2f} us"
            f"  p99 {pct(lat, 0.99):8.2f} us  max {max(lat):8.2f} us; CPU {100.0 * cpu / (w1 - w0):5.1f}% of a core,"
            f" {1e6 * cpu / len(lat):6.1f} us per op ({len(lat)} samples)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
