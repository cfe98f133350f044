#!/usr/bin/env python3
"""PyTorch DDP beside examples/gpu_trainer.rs: the same MLP (LAYERS linear
layers of WIDTH x WIDTH, ReLU between), the same buckets (bucket_cap_mb),
plain SGD, MSE loss on synthetic regression batches of the same shape, on
the NCCL backend. Run with torchrun or alone (world size 1).

Reports, like gpu_trainer: median step time (CUDA events, step start to
step start), host CPU time per step (getrusage, all threads), and from a
torch.profiler trace of a few steps the GPU idle time between kernels on
the compute stream and the communication not hidden behind compute. The
last line is `summary {json}`.

    python3 benches/compare/torch_ddp.py --width 1024 --layers 4 --batch 32
"""
import argparse, json, os, resource, statistics, sys, tempfile, time

import torch
import torch.distributed as dist
import torch.nn as nn


def cpu_time():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def union(spans):
    total, cur = 0.0, None
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if cur and a <= cur[1]:
            cur = (cur[0], max(cur[1], b))
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = (a, b)
    return total + (cur[1] - cur[0] if cur else 0.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--bucket-mib", type=float, default=25.0)
    p.add_argument("--lr", type=float, default=6.0)
    p.add_argument("--data-batches", type=int, default=8)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--profile", default=None, help="write the profiler's Chrome trace here")
    # Flags of gpu_trainer that do not apply here (--check-steps, --print-every) are ignored.
    a = p.parse_known_args()[0]

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dev = torch.device("cuda", local)
    torch.manual_seed(1)
    layers = []
    for i in range(a.layers):
        layers.append(nn.Linear(a.width, a.width))
        if i + 1 < a.layers:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(dev)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[local], bucket_cap_mb=a.bucket_mib, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    r3 = 3.0 ** 0.5
    xs = ((torch.rand(a.data_batches, a.batch, a.width, generator=g) * 2 - 1) * r3).to(dev)
    tg = torch.Generator(device="cpu").manual_seed(7)
    idx = torch.randint(0, a.width, (a.width, 4), generator=tg).to(dev)
    coef = ((torch.rand(a.width, 4, generator=tg) * 3) - 1.5).to(dev)
    ys = torch.tanh((xs[:, :, idx] * coef).sum(-1))
    loss_fn = nn.MSELoss()

    def step(s):
        b = s % a.data_batches
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(ddp(xs[b]), ys[b])
        loss.backward()
        opt.step()
        return loss

    prof_from = a.steps - min(a.profile_steps, a.steps // 2)
    warm = max(1, min(10, a.steps // 10))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
    losses = []
    for s in range(prof_from):
        if s == warm:
            torch.cuda.synchronize()
            c0, w0 = cpu_time(), time.perf_counter()
        starts[s].record()
        losses.append(step(s))
    starts[prof_from].record()
    c1, w1 = cpu_time(), time.perf_counter()
    timed = max(prof_from - warm, 1)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in range(prof_from, a.steps):
            starts[s].record()
            losses.append(step(s))
        starts[a.steps].record()
        torch.cuda.synchronize()
    step_ms = [starts[s].elapsed_time(starts[s + 1]) for s in range(warm, prof_from)]
    trace = a.profile or os.path.join(tempfile.mkdtemp(), "torch_ddp_trace.json")
    prof.export_chrome_trace(trace)
    events = json.load(open(trace))["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if "nccl" not in e["name"].lower()]
    n_prof = max(a.steps - prof_from, 1)
    idle = exposed = 0.0
    if gpu:
        t0 = min(e["ts"] for e in gpu)
        t1 = max(e["ts"] + e["dur"] for e in gpu)
        idle = ((t1 - t0) - union(compute)) / n_prof / 1e3
        exposed = (union(comm + compute) - union(compute)) / n_prof / 1e3
    vals = [float(l) for l in losses]
    q = max(len(vals) // 4, 1)
    fell = sum(vals[-q:]) / q < 0.95 * sum(vals[:q]) / q
    summary = {
        "impl": "torch_ddp", "world": world, "width": a.width, "layers": a.layers,
        "batch": a.batch, "bucket_mib": a.bucket_mib, "steps": a.steps,
        "step_ms": statistics.median(step_ms),
        "host_cpu_ms": (c1 - c0) * 1e3 / timed,
        "host_wall_ms": (w1 - w0) * 1e3 / timed,
        "gpu_idle_ms": idle, "exposed_comm_ms": exposed,
        "samples_per_s": a.batch * world / (statistics.median(step_ms) / 1e3),
        "first_loss": vals[0], "last_loss": vals[-1], "loss_fell": fell,
        "torch": torch.__version__,
    }
    if rank == 0:
        print(f"torch DDP: {world} rank(s), MLP {a.layers} x {a.width}, batch {a.batch}/rank, "
              f"step {summary['step_ms']:.3f} ms (median), host CPU {summary['host_cpu_ms']:.3f} ms/step, "
              f"GPU idle {idle:.3f} ms, exposed comm {exposed:.3f} ms, loss {vals[0]:.4f} -> {vals[-1]:.4f}")
        print("summary " + json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
