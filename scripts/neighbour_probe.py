#!/usr/bin/env python3
"""Issue 16: does a shardkit feed slow a training step through the process it shares with it
(one CUDA context, one driver, the launching thread's process) or through the machine it
shares (cores, caches, memory, the GPU)? Trains a model on synthetic data in this process and
runs, phase by phase, a feed beside it: in a second process ("out:", a CUDA context of its
own, throttled to the model's rate alone), or in this one ("in:", the model trains on its
batches), or in this one drained by a thread of its own and throttled like out: ("side:",
the model trains on synthetic data: the process shared, the batches not consumed), or
nothing ("none"), or the feed alone in this process ("feed:", no training step). Prints ms
per training step for each phase: wall, the host time to launch the step, the GPU time
between CUDA events around it; with --profile the GPU path's gpu_profile() per
batch, with --trace N a torch.profiler trace of N more steps (every stream, nvJPEG's too).

  python3 scripts/neighbour_probe.py --shards M.manifest.json --model resnet18 \
      --phases none,out:cpu,out:gpu@1.0,in:gpu@1.0,out:gpu@0,in:gpu@0,none --seconds 8 [--graph]

A feed spec is cpu (the CPU loader, batches in host memory, no CUDA in the neighbour),
gpu@S (the GPU decode path with the engines' share S), auto; #N sets its host threads.
The run is a measurement, not a test.
"""
import argparse
import os
import re
import subprocess
import sys
import threading
import time


def loader_for(spec, shards, batch, device, profile=False):
    import shardkit

    m = re.fullmatch(r"(cpu|gpu|auto)((?:[@#][0-9.]+)*)", spec)
    if not m:
        raise SystemExit(f"bad feed {spec!r}")
    mods = dict(re.findall(r"([@#])([0-9.]+)", m.group(2)))
    kw = {}
    if m.group(1) == "cpu":
        kw["decoder"] = "cpu"
    elif m.group(1) == "gpu":
        kw["decoder"] = "gpu"
    if "@" in mods:
        kw["hardware_load"] = float(mods["@"])
    if "#" in mods:
        kw["threads"] = int(mods["#"])
    if profile and device != "cpu" and m.group(1) != "cpu":
        kw["profile"] = True
    return shardkit.Loader(shards, batch_size=batch, seed=0, device=device, layout="channels_last",
                           drop_last=True, **kw)


def endless(ld):
    e = 0
    while True:
        ld.set_epoch(e)
        for b in ld:
            yield b
        e += 1


def drain(ld, batch, rate, ready, stop=None):
    """Takes the loader's batches and drops them, at most `rate` images/s (0: unthrottled);
    calls ready() after the fifth; returns when stop (a threading.Event) is set."""
    t0 = time.perf_counter()
    n = 0
    for images, labels in endless(ld):
        del images, labels
        n += 1
        if n == 5:
            ready()
        if stop is not None and stop.is_set():
            return
        if rate > 0:
            ahead = t0 + n * batch / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)


def neighbour(args):
    """The feed in a process of its own: batches at most at --rate images/s, dropped."""
    dev = "cpu" if args.feed.startswith("cpu") else "cuda:0"
    if dev != "cpu":
        import torch  # noqa: F401  (the Loader's CUDA tensors)
    ld = loader_for(args.feed, args.shards, args.batch, dev)
    drain(ld, args.batch, args.rate, lambda: print("ready", flush=True))
    return 0


def trainer(args):
    import torch
    import torchvision

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=device)
    if args.model == "probe_launch":
        px = torch.zeros(1024, device=device)

        def step(images, labels):
            for _ in range(3000):
                px.add_(1.0)
    else:
        model = getattr(torchvision.models, args.model)().to(device, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(images, labels):
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not args.graph):
                loss = loss_fn(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        if args.graph:
            # The whole step captured once in a CUDA graph (PyTorch's whole-network capture):
            # one launch per step, so the launching thread's speed no longer matters.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step(x, y)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                    static_loss = loss_fn(model(x), y)
                static_loss.backward()
                opt.step()

            def step(images, labels):  # noqa: F811
                if images.data_ptr() != x.data_ptr():
                    x.copy_(images)
                if labels.data_ptr() != y.data_ptr():
                    y.copy_(labels)
                graph.replay()

    def synthetic():
        while True:
            yield x, y

    def measure(batches, seconds, train=True):
        run = step if train else (lambda images, labels: None)
        for _ in range(args.warmup):
            images, labels = next(batches)
            run(images, labels)
        torch.cuda.synchronize()
        marks, launch, wait, n = [], 0.0, 0.0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            tw = time.perf_counter()
            images, labels = next(batches)
            tl = time.perf_counter()
            wait += tl - tw
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
            run(images, labels)
            ev[1].record()
            marks.append(ev)
            launch += time.perf_counter() - tl
            n += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        gpu = [a.elapsed_time(b) for a, b in marks]
        return {"steps": n, "wall": 1000 * wall / n, "wait": 1000 * wait / n, "launch": 1000 * launch / n,
                "gpu": sum(gpu) / n, "gpu_min": min(gpu)}

    def trace(batches, phase, train):
        """args.trace more steps under torch.profiler (CUDA kernels and copies of every stream
        of the process, nvJPEG's included), written as a gzipped Chrome trace to $TRACE_DIR
        or $OUT."""
        from torch.profiler import ProfilerActivity, profile

        run = step if train else (lambda images, labels: None)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.trace):
                images, labels = next(batches)
                run(images, labels)
            torch.cuda.synchronize()
        out = os.environ.get("TRACE_DIR") or os.environ.get("OUT") or "/tmp"
        name = os.path.join(out, "trace-" + re.sub(r"[^A-Za-z0-9.]+", "_", phase) + ".json")
        prof.export_chrome_trace(name)
        subprocess.run(["gzip", "-f", name], check=False)

    rows = []
    alone = measure(synthetic(), args.seconds)  # warms cudnn's choices too; the rate for throttling
    rate = args.batch * 1000 / alone["wall"]
    print(f"warm-up phase: {alone['wall']:.1f} ms/step ({rate:.0f} images/s)", file=sys.stderr, flush=True)
    for phase in args.phases.split(","):
        proc = None
        batches = synthetic()
        if phase.startswith("out:"):
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--neighbour", "--feed", phase[4:],
                                     "--shards", args.shards, "--batch", str(args.batch), "--rate", str(round(rate))],
                                    stdout=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(f"neighbour {phase} did not start (exit {proc.wait()})")
        elif phase.startswith("side:"):
            # The out: neighbour's work in this process: a thread drains the loader (cpu:
            # batches in host memory, no CUDA; else CUDA batches in this process's context)
            # at most at the model's rate, while the model trains on synthetic data.
            spec = phase[5:]
            side_ld = loader_for(spec, args.shards, args.batch, "cpu" if spec.startswith("cpu") else "cuda:0")
            ready, stop, side_err = threading.Event(), threading.Event(), []

            def side_run():
                try:
                    drain(side_ld, args.batch, rate, ready.set, stop)
                except BaseException as e:  # reported after the phase: a measure without its neighbour is void
                    side_err.append(e)
                    ready.set()

            side = threading.Thread(target=side_run, daemon=True)
            side.start()
            if not ready.wait(120) or side_err:
                raise SystemExit(f"{phase}: the feed did not start: {side_err[0] if side_err else 'no batch in 120 s'}")
        elif phase.startswith(("in:", "feed:")):
            ld = loader_for(phase.split(":", 1)[1], args.shards, args.batch, "cuda:0", args.profile)
            batches = ((im, y) for im, _ in endless(ld))
        elif phase != "none":
            raise SystemExit(f"bad phase {phase!r}")
        train = not phase.startswith("feed:")
        r = measure(batches, args.seconds, train=train)
        if args.trace and phase != "none" and not phase.startswith("out:"):
            trace(batches, phase, train=train)
        if proc:
            proc.terminate()
            proc.wait()
        if phase.startswith("side:"):
            stop.set()
            side.join()
            if side_err:
                raise SystemExit(f"{phase}: the feed failed during the phase: {side_err[0]}")
            r["summary"] = side_ld.summary() if hasattr(side_ld, "summary") else ""
            side_ld.close()
        if phase.startswith(("in:", "feed:")):
            r["summary"] = ld.summary() if hasattr(ld, "summary") else ""
            prof = ld.gpu_profile() if args.profile else None
            if prof and prof.get("enabled") and prof.get("batches"):
                nb = prof["batches"]
                gt = max(1, prof.get("gpu_timed", 0))
                r["profile"] = ", ".join(f"{k} {1000 * v / nb:.1f}" if k.endswith("_s") else f"{k} {v / gt:.1f}"
                                         for k, v in prof.items() if isinstance(v, float))
                r["profile"] = f"per batch ({nb} batches), ms: " + r["profile"]
            ld.close()
            del ld, batches
        r["phase"] = phase
        rows.append(r)
        print(f"{phase}: {r['wall']:.1f} ms/step", file=sys.stderr, flush=True)
    base = [r for r in rows if r["phase"] == "none"]
    base = min(r["wall"] for r in base) if base else alone["wall"]
    print(f"{args.model}{' (CUDA graph)' if args.graph else ''}, batch {args.batch}, {args.seconds:g} s per phase; ms per step "
          f"(x = wall / best 'none' wall {base:.1f})")
    print(f"{'phase':16s} {'steps':>6s} {'wall':>6s} {'x':>5s} {'wait':>6s} {'launch':>7s} {'gpu':>6s} {'gpu min':>8s}")
    for r in rows:
        print(f"{r['phase']:16s} {r['steps']:6d} {r['wall']:6.1f} {r['wall'] / base:5.2f} {r['wait']:6.1f} "
              f"{r['launch']:7.1f} {r['gpu']:6.1f} {r['gpu_min']:8.1f}")
    for r in rows:
        if r.get("summary"):
            print(f"{r['phase']}: {r['summary']}")
        if r.get("profile"):
            print(f"{r['phase']} profile {r['profile']}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--model", default="resnet18", help="a torchvision model, or probe_launch")
    ap.add_argument("--phases", default="none,out:cpu,out:gpu@1.0,in:gpu@1.0,out:gpu@0,in:gpu@0,none")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--graph", action="store_true", help="the training step captured in a CUDA graph (a torchvision model)")
    ap.add_argument("--profile", action="store_true", help="in: feeds with profile=True; prints gpu_profile() per batch")
    ap.add_argument("--trace", type=int, default=0, help="in:/feed: phases: N more steps under torch.profiler, "
                    "a gzipped Chrome trace each in $TRACE_DIR or $OUT")
    ap.add_argument("--neighbour", action="store_true")
    ap.add_argument("--feed", default="")
    ap.add_argument("--rate", type=float, default=0, help="neighbour: images/s at most (0: unthrottled)")
    args = ap.parse_args()
    return neighbour(args) if args.neighbour else trainer(args)


if __name__ == "__main__":
    sys.exit(main())
