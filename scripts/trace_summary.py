#!/usr/bin/env python3
"""Summarises a torch.profiler Chrome trace (scripts/neighbour_probe.py --trace N writes them):
GPU work per stream (kernels, copies, memsets: count and busy ms, by name) and, per host
thread, the CUDA runtime calls that took the most time. Issue 16 used it to find where the
hardware JPEG engines' batches spend their time under a training model.

  python3 scripts/trace_summary.py trace-in_gpu_1.0.json.gz [--streams 12] [--threads 6]
"""
import argparse
import collections
import gzip
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--streams", type=int, default=12, help="streams to list, busiest first")
    ap.add_argument("--threads", type=int, default=6, help="host threads to list, most runtime time first")
    args = ap.parse_args()
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    per_stream = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in gpu:
        x = per_stream[e["args"].get("stream")][(e["cat"], e["name"][:72])]
        x[0] += 1
        x[1] += e["dur"]
    busy = sorted(per_stream.items(), key=lambda kv: -sum(v[1] for v in kv[1].values()))
    print(f"GPU work: {len(gpu)} operations on {len(per_stream)} streams; busiest first (count, ms):")
    for stream, ops in busy[: args.streams]:
        total = sum(v[1] for v in ops.values()) / 1000
        print(f"  stream {stream}: {total:.1f} ms")
        for (cat, name), (n, dur) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:4]:
            print(f"    {n:6d} {dur / 1000:8.1f}  {cat}: {name}")

    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    per_thread = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in runtime:
        x = per_thread[e["tid"]][e["name"]]
        x[0] += 1
        x[1] += e["dur"]
    ranked = sorted(per_thread.items(), key=lambda kv: -sum(v[1] for v in kv[1].values()))
    print("CUDA runtime calls per host thread, most time first (calls, ms):")
    for tid, calls in ranked[: args.threads]:
        total = sum(v[1] for v in calls.values()) / 1000
        top = sorted(calls.items(), key=lambda kv: -kv[1][1])[:5]
        print(f"  thread {tid}: {total:.1f} ms; " + ", ".join(f"{n} {c} {d / 1000:.1f}" for n, (c, d) in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
