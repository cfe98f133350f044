#!/usr/bin/env python3
"""Folds `perf script -F ip,sym` output (recorded with --call-graph) into
two tables: the share of samples in which each function is on the stack
(inclusive) and at its top (self), counting only samples whose stack holds
a frame named by --under (e.g. the timed loop), and cutting each stack at
that frame.

    perf script -i perf.data -F ip,sym | python3 fold-perf.py --under group_probe::layer
"""

import argparse
import collections
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--under", required=True, help="count samples below this frame only")
    ap.add_argument("--top", type=int, default=60, help="rows per table")
    args = ap.parse_args()
    incl, own, total = collections.Counter(), collections.Counter(), 0
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


if __name__ == "__main__":
    main()
