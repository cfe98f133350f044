#!/usr/bin/env python3
"""Folds `perf script -F ip,sym` output (recorded with --call-graph) into
two tables: the share of samples in which each function is on the stack
(inclusive) and at its top (self), counting only samples whose stack holds
a frame named by --under (e.g. the timed loop), and cutting each stack at
that frame. With --callers NAME (repeatable), a third table per NAME: the
commonest chains of callers above the first frame whose name holds NAME,
e.g. who calls malloc, or which of our calls a driver lock sits under
(the driver's own frames have no symbols and read [unknown]).

    perf script -i perf.data -F ip,sym | python3 fold-perf.py --under group_probe::layer \
        [--callers malloc --callers pthread_mutex_lock]
"""

import argparse
import collections
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--under", required=True, help="count samples below this frame only")
    ap.add_argument("--top", type=int, default=60, help="rows per table")
    ap.add_argument("--callers", action="append", default=[],
                    help="also list the caller chains above frames holding this name")
    ap.add_argument("--depth", type=int, default=7, help="frames per caller chain")
    args = ap.parse_args()
    incl, own, total = collections.Counter(), collections.Counter(), 0
    chains = {name: collections.Counter() for name in args.callers}
    stack = []

    def flush():
        nonlocal total
        cut = []
        for f in stack:  # leaf first
            if args.under in f:
                break
            cut.append(f)
        else:
            return  # not under the frame
        total += 1
        if cut:
            own[cut[0]] += 1
        for f in set(cut):
            incl[f] += 1
        for name, table in chains.items():
            at = next((i for i, f in enumerate(cut) if name in f), None)
            if at is not None:
                table[" <- ".join(f[:60] for f in cut[at:at + args.depth])] += 1

    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            flush()
            stack = []
            continue
        if line[:1] in "\t ":
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                sym = re.sub(r"\+0x[0-9a-f]+$", "", parts[1].split(" (")[0])
                stack.append(re.sub(r"::h[0-9a-f]{16}$", "", sym)[:140])
    flush()
    print(f"samples under {args.under}: {total}")
    for name, table in (("inclusive", incl), ("self", own)):
        print(f"== {name}")
        for sym, n in table.most_common(args.top):
            print(f"{100 * n / max(total, 1):6.2f}% {sym}")
    for name, table in chains.items():
        print(f"== callers of {name}: {100 * sum(table.values()) / max(total, 1):.2f}%")
        for chain, n in table.most_common(args.top // 6):
            print(f"{100 * n / max(total, 1):6.2f}% {chain}")


if __name__ == "__main__":
    main()
