#!/usr/bin/env python3
"""DDP training fed by shardkit.Loader vs the DataLoader, on G GPUs of one host, in one run.

    python3 scripts/bench_ddp.py --shards ADDRESS --folder DIR [--gpus 1,2] [--models resnet50,resnet18]
        [--feeds synthetic,dataloader,shardkit] [--batch 256] [--warmup 10] [--steps 40]

For each G in --gpus the script starts one process tree, `torchrun --standalone
--nproc_per_node=G` over itself, and every rank trains each model in turn (torchvision
ResNet, DistributedDataParallel over NCCL, bf16 autocast, channels_last, SGD) from each
feed in turn:
  synthetic   one random batch resident on the GPU: the ceiling for this G
  dataloader  torchvision ImageFolder + DistributedSampler + DataLoader (pinned memory,
              cores-per-rank - 1 workers), RandomResizedCrop(224) + flip + normalise
  shardkit    shardkit.Loader with its defaults (rank and world from torchrun, decoder
              "auto", threads from the rank's CPU affinity), device=cuda:LOCAL_RANK
  shardkit_cpu / shardkit_gpu   the same with the decoder pinned; a suffix @X pins the
              engines' share (hardware_load=X), e.g. shardkit_gpu@1.0, shardkit_gpu@0; #N sets its host
              threads (shardkit#12)
  feed, feed_cpu, feed_gpu@1.0, ...   (no model) the loader alone: what the feed delivers
Each rank is pinned (os.sched_setaffinity) to its own block of the host's cores,
cores / GPUs-on-the-host of them, whatever G is, so that G = 1 and G = 2 see the same
cores per GPU, as on a full 8-GPU host. Images/s are for the whole job (G x batch x
steps / the slowest rank's time, timed between barriers after the warm-up steps).
One JSON line per (G, model, feed) on stdout, then a table with each feed's share of the
ceiling and the scaling G x / (G x 1-GPU).

Where the time goes (issue 16): --timeline adds, per step, the wait in next(), the host
time to launch the step and the GPU time between CUDA events around it; --profile adds
the GPU decode path's gpu_profile() per batch. Models probe_mm (bf16 matmuls: GPU-bound,
few launches) and probe_launch (3,000 tiny kernels: launch-bound) tell a feed that slows
the GPU from one that slows the launching thread; a model name ending in ^ (resnet18^)
trains on a stream of the highest priority; --ctx-sched spin|yield|blocking sets how the
process's threads wait for the GPU (the primary context's flag).
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# NVLink multicast stays off on shared hosts (the device machines' rule); harmless elsewhere.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def pin_rank(local_rank, gpus_on_host):
    """Pins this process to its block of the host's cores; returns the block's size."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // max(1, gpus_on_host))
    mine = cores[local_rank * per:(local_rank + 1) * per] or cores
    os.sched_setaffinity(0, mine)
    return len(mine)


def set_ctx_sched(ordinal, how):
    """How host threads wait for the GPU in this process (cuDevicePrimaryCtxSetFlags; before
    the primary context is created): spin, yield or blocking (CUDA's default is spin while
    there are more cores than contexts)."""
    import ctypes

    flags = {"spin": 1, "yield": 2, "blocking": 4}[how]
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    fn = getattr(cu, "cuDevicePrimaryCtxSetFlags_v2", None) or cu.cuDevicePrimaryCtxSetFlags
    rc = fn(dev, ctypes.c_uint(flags))
    if rc != 0:
        raise SystemExit(f"cuDevicePrimaryCtxSetFlags({how}) failed: CUresult {rc}")


def worker(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    import torch  # after the environment is read; before pinning would not matter (no threads yet)

    if args.ctx_sched:
        set_ctx_sched(local_rank, args.ctx_sched)
    per_rank = pin_rank(local_rank, args.host_gpus or torch.cuda.device_count())
    import torch.distributed as dist
    import torchvision

    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)
    torch.backends.cudnn.benchmark = True
    out = []

    def endless(make_iter):
        epoch = 0
        while True:
            for batch in make_iter(epoch):
                yield batch
            epoch += 1

    def feed_synthetic():
        g = torch.Generator(device=device).manual_seed(rank)
        x = torch.randn(args.batch, 3, 224, 224, device=device, generator=g).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (args.batch,), device=device, generator=g)
        while True:
            yield x, y

    def feed_shardkit(spec):
        import shardkit

        # shardkit_gpu@0.7#12: engines' share 0.7, 12 host threads
        m = re.fullmatch(r"([a-z]+(?:_[a-z]+)?)((?:[@#][0-9.]+)*)", spec)
        if not m:
            raise SystemExit(f"bad feed {spec!r}")
        spec, mods = m.group(1), dict((k, v) for k, v in re.findall(r"([@#])([0-9.]+)", m.group(2)))
        decoder = spec.split("_", 1)[1] if "_" in spec else "auto"
        kw = {} if decoder == "auto" else {"decoder": decoder}
        if "@" in mods:
            kw["hardware_load"] = float(mods["@"])
        if "#" in mods:
            kw["threads"] = int(mods["#"])
        if args.profile:
            kw["profile"] = True
        ld = shardkit.Loader(args.shards, batch_size=args.batch, seed=0, device=f"cuda:{local_rank}",
                             layout="channels_last", drop_last=True, **kw)
        info = {"decoder": ld.decoder, "threads": getattr(ld, "threads", None), "batches_per_epoch": len(ld)}

        def epoch(e):
            ld.set_epoch(e)
            return iter(ld)

        return ld, endless(epoch), info

    def feed_dataloader():
        from torchvision import datasets, transforms

        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
        ds = datasets.ImageFolder(args.folder, transform=tf)
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, seed=0,
                                                                  drop_last=True)
        workers = max(1, per_rank - 1)
        dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=workers,
                                         pin_memory=True, persistent_workers=True, drop_last=True,
                                         prefetch_factor=4)

        def epoch(e):
            sampler.set_epoch(e)
            return iter(dl)

        return dl, endless(epoch), {"workers": workers}

    for model_spec in args.models.split(","):
        # resnet18^: the training loop runs on a stream of the highest priority
        model_name, hi_prio = model_spec.rstrip("^"), model_spec.endswith("^")
        for feed in args.feeds.split(","):
            torch.manual_seed(0)
            owner, info = None, {}
            if feed == "synthetic":
                batches = feed_synthetic()
            elif feed == "dataloader":
                owner, batches, info = feed_dataloader()
            elif feed.startswith("feed") or feed.startswith("shardkit"):
                owner, batches, info = feed_shardkit(feed)
            else:
                raise SystemExit(f"unknown feed {feed!r}")
            step = None
            if not feed.startswith("feed") and model_name.startswith("probe_"):
                # Probes that tell GPU contention from host contention: probe_mm is GPU-bound
                # (bf16 4096^3 matmuls, few launches), probe_launch is launch-bound (thousands
                # of tiny kernels). Their step time under a feed against under synthetic
                # data says whether the feed slows the GPU or the launching thread.
                pa = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
                pb = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
                px = torch.zeros(1024, device=device)

                def step(images, labels):
                    if model_name == "probe_mm":
                        for _ in range(args.probe_mm):
                            torch.mm(pa, pb)
                    else:
                        for _ in range(args.probe_launch):
                            px.add_(1.0)
            elif not feed.startswith("feed"):
                model = getattr(torchvision.models, model_name)().to(device, memory_format=torch.channels_last)
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
                loss_fn = torch.nn.CrossEntropyLoss()

                def step(images, labels):
                    images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
                    if labels.device.type == "cpu" and not labels.is_pinned():
                        labels = labels.pin_memory()
                    labels = labels.to(device, non_blocking=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = loss_fn(model(images), labels)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            else:
                if model_spec != args.models.split(",")[0]:
                    owner.close()
                    continue  # the feed alone does not depend on the model

            ctx = contextlib.nullcontext()
            if hi_prio:
                hs = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1]
                                       if hasattr(torch.cuda.Stream, "priority_range") else -1)
                hs.wait_stream(torch.cuda.current_stream(device))
                ctx = torch.cuda.stream(hs)
            ctx.__enter__()
            it = iter(batches)
            for _ in range(args.warmup):
                images, labels = next(it)
                if step:
                    step(images, labels)
            torch.cuda.synchronize(device)
            dist.barrier()
            t0 = time.perf_counter()
            wait = 0.0
            launch = 0.0
            marks = []  # (start, end) CUDA events around each step on the training stream
            for _ in range(args.steps):
                tw = time.perf_counter()
                images, labels = next(it)
                tl = time.perf_counter()
                wait += tl - tw
                if args.timeline:
                    ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    ev[0].record()
                if step:
                    step(images, labels)
                else:
                    images.sum()  # consume on the GPU
                if args.timeline:
                    ev[1].record()
                    marks.append(ev)
                launch += time.perf_counter() - tl
            torch.cuda.synchronize(device)
            mine = time.perf_counter() - t0
            ctx.__exit__(None, None, None)
            dist.barrier()
            slowest = torch.tensor([mine], device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if hasattr(owner, "summary"):
                info["summary"] = owner.summary()
                info["hardware_share"] = round(owner.input_stats()["hardware_share"], 3)
                prof = owner.gpu_profile() if args.profile else None
                if prof and prof.get("enabled") and prof["batches"]:
                    nb = prof["batches"]
                    info["profile_ms_per_batch"] = {k[:-2]: round(1000 * v / nb, 2) for k, v in prof.items()
                                                    if k.endswith("_s")}
                    if prof.get("gpu_timed"):
                        info["profile_ms_per_batch"].update({k: round(v / prof["gpu_timed"], 2)
                                                             for k, v in prof.items() if k.endswith("_ms")})
            if args.timeline:
                # per step, ms: the wait in next(), the host time to launch the step, and
                # the GPU time between events around the step (kernels plus any gaps the
                # launching thread leaves); wall = the timed loop / steps
                gpu = [a.elapsed_time(b) for a, b in marks]
                info["timeline_ms"] = {"wall": round(1000 * mine / args.steps, 2),
                                       "wait": round(1000 * wait / args.steps, 2),
                                       "launch": round(1000 * launch / args.steps, 2),
                                       "gpu_step": round(sum(gpu) / len(gpu), 2),
                                       "gpu_step_min": round(min(gpu), 2)}
            r = {"gpus": world, "model": model_spec if not feed.startswith("feed") else "none", "feed": feed,
                 "images_per_s": round(world * args.batch * args.steps / float(slowest), 1),
                 "rank0_wait_in_next_s": round(wait, 3), "cores_per_rank": per_rank, **info}
            if hasattr(owner, "close"):
                owner.close()
            del batches, owner, step
            torch.cuda.empty_cache()
            if rank == 0:
                print(json.dumps(r), flush=True)
                out.append(r)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def driver(args):
    rows = []
    env = dict(os.environ, **SAFE_ENV)
    for g in [int(x) for x in args.gpus.split(",")]:
        out = os.path.join(args.workdir, f"ddp-g{g}.json")
        if os.path.exists(out):
            os.remove(out)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={g}",
               os.path.abspath(__file__), "--worker", "--out", out, "--host-gpus", str(args.host_gpus),
               "--shards", args.shards, "--folder", args.folder, "--models", args.models, "--feeds", args.feeds,
               "--batch", str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps)]
        cmd += ["--timeline"] if args.timeline else []
        cmd += ["--ctx-sched", args.ctx_sched] if args.ctx_sched else []
        cmd += ["--profile"] if args.profile else []
        print(f"== G={g}: {' '.join(cmd[3:6])} ...", file=sys.stderr, flush=True)
        t = time.time()
        rc = subprocess.call(cmd, env=env, timeout=args.timeout)
        print(f"== G={g}: exit {rc} after {time.time() - t:.0f} s", file=sys.stderr, flush=True)
        if rc == 0 and os.path.exists(out):
            rows += json.load(open(out))
        else:
            rows.append({"gpus": g, "error": f"torchrun exit {rc}"})
    table(rows)
    return 0 if all("error" not in r for r in rows) else 1


def table(rows):
    ok = [r for r in rows if "error" not in r]
    ceiling = {(r["gpus"], r["model"]): r["images_per_s"] for r in ok if r["feed"] == "synthetic"}
    one = {(r["model"], r["feed"]): r["images_per_s"] for r in ok if r["gpus"] == 1}
    print()
    print("DDP training, images/s of the whole job (share of that G's synthetic ceiling; "
          "scaling = G-GPU rate / (G x 1-GPU rate))")
    print(f"{'model':9s} {'G':>2s} {'feed':16s} {'images/s':>9s} {'x ceiling':>9s} {'scaling':>8s} {'wait s':>7s} "
          f"{'engines':>7s}" + ("  ms/step: wall wait launch gpu (min)" if any("timeline_ms" in r for r in ok) else ""))
    for r in ok:
        c = ceiling.get((r["gpus"], r["model"]))
        base = one.get((r["model"], r["feed"]))
        share = f"{r['images_per_s'] / c:.2f}" if c and r["feed"] != "synthetic" else "-"
        scale = f"{r['images_per_s'] / (r['gpus'] * base):.2f}" if base and r["gpus"] > 1 else "-"
        hw = r.get("hardware_share")
        hw = f"{hw:.2f}" if isinstance(hw, float) and hw >= 0 else "-"
        t = r.get("timeline_ms")
        t = f"  {t['wall']:.1f} {t['wait']:.1f} {t['launch']:.1f} {t['gpu_step']:.1f} ({t['gpu_step_min']:.1f})" if t else ""
        print(f"{r['model']:9s} {r['gpus']:2d} {r['feed']:16s} {r['images_per_s']:9.1f} {share:>9s} {scale:>8s} "
              f"{r['rank0_wait_in_next_s']:7.2f} {hw:>7s}{t}")
    for r in ok:
        if "summary" in r:
            print(f"{r['model']} {r['feed']}: {r['summary']}")
        if "profile_ms_per_batch" in r:
            p = r["profile_ms_per_batch"]
            print(f"profile {r['model']} {r['feed']} (ms per batch): " + ", ".join(f"{k} {v}" for k, v in p.items()))
    for r in rows:
        if "error" in r:
            print(f"G={r['gpus']}: {r['error']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--host-gpus", type=int, default=0, help="GPUs whose share of the cores a rank takes "
                    "(0 = all GPUs of the host)")
    ap.add_argument("--models", default="resnet50,resnet18", help="torchvision models, or probe_mm / probe_launch "
                    "(GPU-bound / launch-bound steps without a model)")
    ap.add_argument("--feeds", default="synthetic,shardkit,dataloader")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--workdir", default="/tmp")
    ap.add_argument("--out", default="")
    ap.add_argument("--timeline", action="store_true", help="per step: wait in next(), launch time, GPU time "
                    "between CUDA events around the step")
    ap.add_argument("--profile", action="store_true", help="shardkit feeds: profile=True, gpu_profile() per batch")
    ap.add_argument("--probe-mm", type=int, default=140, help="probe_mm: matmuls per step")
    ap.add_argument("--probe-launch", type=int, default=3000, help="probe_launch: tiny kernels per step")
    ap.add_argument("--ctx-sched", choices=["spin", "yield", "blocking"], default=None,
                    help="how this process's host threads wait for the GPU (CUDA context flag)")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if not args.host_gpus:
        import torch

        args.host_gpus = torch.cuda.device_count()
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
