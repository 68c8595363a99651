#!/usr/bin/env python3
"""Median new/old table from scripts/device_arch.sh's bench outputs.

Reads DIR/read-{old,new}-R.txt (`shardkit bench` tables) and DIR/loader-{old,new}-R.txt
(`shardkit bench --loader`), and prints, per row, the median samples/s (images/s for the
loader) of each binary over the rounds and their ratio.
"""
import glob
import os
import re
import statistics
import sys


def rows(path, loader):
    out = {}
    for line in open(path):
        f = line.split()
        if loader and len(f) >= 6 and f[1].isdigit():
            out[(os.path.basename(f[0]), "loader", f[1])] = float(f[5])
        elif not loader and len(f) >= 10 and f[1].startswith("random-"):
            out[(os.path.basename(f[0]), f[1], f[2])] = float(f[8])
    return out


def main(d):
    table = {}
    for kind in ("read", "loader"):
        for path in sorted(glob.glob(os.path.join(d, f"{kind}-*-*.txt"))):
            v = re.match(rf"{kind}-(old|new)-\d+\.txt", os.path.basename(path)).group(1)
            for k, x in rows(path, kind == "loader").items():
                table.setdefault(k, {"old": [], "new": []})[v].append(x)
    print(f"{'dataset':<22} {'mode':<12} {'thr':>3} {'old (median)':>14} {'new (median)':>14} {'new/old':>8}  rounds")
    for k, v in table.items():
        if not v["old"] or not v["new"]:
            continue
        o, n = statistics.median(v["old"]), statistics.median(v["new"])
        print(f"{k[0]:<22} {k[1]:<12} {k[2]:>3} {o:>14,.0f} {n:>14,.0f} {n / o:>8.2f}  {len(v['old'])}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
