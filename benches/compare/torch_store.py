#!/usr/bin/env python3
"""PyTorch's TCPStore through the store workload of benches/benches/store.rs.

One server (is_master=True, in this process), clients connected over
loopback, 64-byte values. Each client runs set, get (of an existing key)
and add in a loop, one op at a time; prints ops/s for 1 and 16 clients.

    python3 benches/compare/torch_store.py [--seconds S] [--clients 1,16]

Prints one line per (op, clients): `torch  <op>  <clients>  <ops/s>`.
Exits 2 if torch is not installed.
"""
import argparse
import datetime
import os
import sys
import threading
import time
import warnings

warnings.filterwarnings("ignore")
try:
    import torch.distributed as dist
except ImportError:
    print("torch is not installed (pip install torch)", file=sys.stderr)
    sys.exit(2)

VALUE = bytes(range(64))
KEYS = 16


def run_op(store, op, idx, deadline):
    n = 0
    key = f"k{idx}_{0}"
    if op == "set":
        while True:
            for _ in range(64):
                store.set(f"k{idx}_{n % KEYS}", VALUE)
                n += 1
            if time.perf_counter() >= deadline:
                return n
    elif op == "get":
        while True:
            for _ in range(64):
                store.get(key)
                n += 1
            if time.perf_counter() >= deadline:
                return n
    elif op == "add":
        while True:
            for _ in range(64):
                store.add(f"ctr{idx}", 1)
                n += 1
            if time.perf_counter() >= deadline:
                return n
    raise ValueError(op)


def measure(server, op, clients, seconds):
    timeout = datetime.timedelta(seconds=60)
    stores = [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
        for _ in range(clients)
    ]
    for i, s in enumerate(stores):
        s.set(f"k{i}_0", VALUE)
    counts = [0] * clients
    start_barrier = threading.Barrier(clients + 1)

    def worker(i):
        start_barrier.wait()
        counts[i] = run_op(stores[i], op, i, deadline_holder[0])

    deadline_holder = [0.0]
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    deadline_holder[0] = t0 + seconds
    start_barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    del stores
    return sum(counts) / elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--clients", default="1,16")
    a = p.parse_args()
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    import torch

    print(f"# torch {torch.__version__}, TCPStore (libuv server), loopback, "
          f"64-byte values, {os.cpu_count()} cores", flush=True)
    for clients in [int(c) for c in a.clients.split(",")]:
        for op in ("set", "get", "add"):
            rate = measure(server, op, clients, a.seconds)
            print(f"torch  {op:<4} {clients:>3}  {rate:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
