"""PyTorch ProcessGroupNCCL, 1 rank: sequential async all_reduces vs the
coalescing manager, widths 1, 2, 4, 8, 16 of 1 MiB f32 each. Host submit
time and total time (submit until torch.cuda.synchronize()), medians in µs.
Run beside benches' group_bench in the same call."""
import argparse, json, os, time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager


def measure(iters, fn):
    for _ in range(iters // 5 + 10):
        fn()
    sub, tot = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        t1 = fn()
        t2 = time.perf_counter()
        sub.append((t1 - t0) * 1e6)
        tot.append((t2 - t0) * 1e6)
    sub.sort(); tot.sort()
    return sub[len(sub) // 2], tot[len(tot) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--count", type=int, default=262144)
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    rows = []
    print(f"{'width':>5} {'torch seq sub/tot':>22} {'torch coalesced sub/tot':>26}")
    for w in [int(x) for x in a.widths.split(",")]:
        ts = [torch.zeros(a.count, device=dev) for _ in range(w)]

        def seq():
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            t1 = time.perf_counter()
            for x in works:
                x.wait()
            torch.cuda.synchronize()
            return t1

        def coalesced():
            with _coalescing_manager(device=dev, async_ops=True) as cm:
                for t in ts:
                    dist.all_reduce(t)
            t1 = time.perf_counter()
            cm.wait()
            torch.cuda.synchronize()
            return t1

        s = measure(a.iters, seq)
        c = measure(a.iters, coalesced)
        print(f"{w:>5} {s[0]:>10.1f} / {s[1]:>9.1f} {c[0]:>12.1f} / {c[1]:>11.1f}")
        rows.append({"width": w, "torch_seq": {"submit_us": s[0], "total_us": s[1]},
                     "torch_coalesced": {"submit_us": c[0], "total_us": c[1]}})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
