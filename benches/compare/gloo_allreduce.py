#!/usr/bin/env python3
"""PyTorch Gloo all_reduce (f32) latency and bus bandwidth, one process per
rank, the same workload and output format as benches/src/bin/tcp_allreduce.rs.

    python3 benches/compare/gloo_allreduce.py --ranks 2 --sizes 4,65536,16777216

Across hosts, one call per host with its ranks (global rank = node rank x
ranks per node + local rank; rank 0's host prints the results):

    python3 gloo_allreduce.py --ranks 2 --nnodes 2 --node-rank 1 --master-addr node0 --master-port 29612
"""
import argparse
import json
import os
import socket
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker(rank, n, addr, port, sizes, warmup, iters, budget_s, q):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    out = []
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        t = torch.ones(count, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = max(time.perf_counter() - t0, 1e-6)
        want = torch.tensor([min(max(int(budget_s / one), 5), iters)])
        dist.broadcast(want, 0)
        k = int(want.item())
        times = []
        for _ in range(k):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
            t.fill_(1.0)
        tt = torch.tensor(times, dtype=torch.float64)
        gathered = [torch.zeros_like(tt) for _ in range(n)]
        dist.all_gather(gathered, tt)
        if rank == 0:
            per_iter = torch.stack(gathered).max(dim=0).values.sort().values
            med = float(per_iter[int(round((k - 1) * 0.5))])
            p99 = float(per_iter[int(round((k - 1) * 0.99))])
            busbw = count * 4 * 2 * (n - 1) / n / med / 1e9
            out.append({"impl": "gloo", "ranks": n, "bytes": count * 4, "iters": k,
                        "median_us": round(med * 1e6, 1), "p99_us": round(p99 * 1e6, 1),
                        "busbw_gbps": round(busbw, 3)})
    dist.destroy_process_group()
    if rank == 0:
        q.put(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="4,65536,16777216")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--budget-s", type=float, default=3.0)
    ap.add_argument("--nnodes", type=int, default=1, help="hosts; --ranks is then ranks per host")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master-addr", default="127.0.0.1")
    ap.add_argument("--master-port", type=int, default=0, help="0: a free port (one host only)")
    a = ap.parse_args()
    import torch.multiprocessing as mp

    sizes = [int(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = a.master_port or free_port()
    world = a.ranks * a.nnodes
    first = a.node_rank * a.ranks
    procs = [ctx.Process(target=worker, args=(first + r, world, a.master_addr, port, sizes, a.warmup, a.iters,
                                               a.budget_s, q))
             for r in range(a.ranks)]
    for p in procs:
        p.start()
    res = q.get(timeout=600) if first == 0 else []
    for p in procs:
        p.join()
    for r in res:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
