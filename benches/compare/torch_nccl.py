"""PyTorch ProcessGroupNCCL, world size 1, on the same GPU: the side of
benches/src/bin/nccl_bench.rs it is compared with (run both in one call).

Measures, for a small all_reduce (256 f32 by default):
  * host time of dist.all_reduce(t, async_op=True)  (enqueue)
  * host time of work.wait()  (PyTorch: makes the current stream wait; no host wait)
  * round trips per second: all_reduce(async) + wait() + current_stream().synchronize()
    (the host knows the GPU finished, like awaiting a chorus DeviceWork)
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.ones(a.count, device="cuda", dtype=torch.float32)
    for _ in range(2000):
        dist.all_reduce(t, async_op=True).wait()
    torch.cuda.synchronize()

    enq, wait = [], []
    for i in range(a.iters):
        t0 = time.perf_counter_ns()
        w = dist.all_reduce(t, async_op=True)
        t1 = time.perf_counter_ns()
        w.wait()
        t2 = time.perf_counter_ns()
        enq.append((t1 - t0) / 1e3)
        wait.append((t2 - t1) / 1e3)
        if i % 256 == 255:
            torch.cuda.synchronize()
    torch.cuda.synchronize()

    stream = torch.cuda.current_stream()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        dist.all_reduce(t, async_op=True).wait()
        stream.synchronize()
        n += 1
    rt = n / (time.perf_counter() - t0)

    res = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "count": a.count,
        "enqueue_median_us": statistics.median(enq),
        "enqueue_p99_us": pct(enq, 0.99),
        "enqueue_mean_us": statistics.fmean(enq),
        "wait_median_us": statistics.median(wait),
        "wait_p99_us": pct(wait, 0.99),
        "round_trips_per_s": rt,
    }
    print(f"PyTorch {res['torch']} ProcessGroupNCCL (NCCL {res['nccl']}), world size 1, {a.count} x f32")
    print(f"all_reduce(async_op=True)  median {res['enqueue_median_us']:.2f} us  p99 {res['enqueue_p99_us']:.2f} us  mean {res['enqueue_mean_us']:.2f} us")
    print(f"work.wait()                median {res['wait_median_us']:.2f} us  p99 {res['wait_p99_us']:.2f} us")
    print(f"round trips (async + wait + stream sync)  {rt:.0f} /s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
