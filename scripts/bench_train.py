#!/usr/bin/env python3
"""A short ResNet-50 training loop fed by shardkit.Loader vs torchvision's ImageFolder DataLoader.

    python3 scripts/bench_train.py --shards ADDRESS --folder DIR [--batch 256] [--warmup 5] [--steps 30]

torchvision.models.resnet50(), AMP bf16 autocast, channels_last, SGD (momentum 0.9), the
same RandomResizedCrop(224) + flip + normalisation on both sides. Reports training
images/s over the timed steps (after the warm-up steps, synchronised at both ends) and
the GPU utilisation sampled every 200 ms by `nvidia-smi -lms 200` during the timed steps
(torch.cuda.utilization() when nvidia-smi is missing). One JSON line per run on stdout,
then a short table.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import torch
import torchvision

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class UtilSampler:
    """GPU utilisation samples (percent) of one device while running."""

    def __init__(self, device_index):
        self.samples = []
        self.index = device_index
        self.proc = None
        self.stop = threading.Event()
        self.thread = None

    def __enter__(self):
        smi = shutil.which("nvidia-smi")
        if smi:
            self.proc = subprocess.Popen(
                [smi, "-i", str(self.index), "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read_smi, daemon=True)
        else:
            self.thread = threading.Thread(target=self._poll_torch, daemon=True)
        self.thread.start()
        return self

    def _read_smi(self):
        for line in self.proc.stdout:
            if self.stop.is_set():
                break
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def _poll_torch(self):
        while not self.stop.is_set():
            try:
                self.samples.append(float(torch.cuda.utilization(self.index)))
            except Exception:  # no pynvml / amdsmi
                return
            time.sleep(0.2)

    def __exit__(self, *exc):
        self.stop.set()
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
        self.thread.join(timeout=2)
        return False

    def mean(self):
        # Drop the first sample: it covers time before the timed steps.
        s = self.samples[1:] or self.samples
        return sum(s) / len(s) if s else float("nan")


def endless(make_iter):
    epoch = 0
    while True:
        for batch in make_iter(epoch):
            yield batch
        epoch += 1


def train(name, batches, args, device):
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step(images, labels):
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
        if labels.device.type == "cpu" and not labels.is_pinned():
            labels = labels.pin_memory()  # shardkit's labels: a copy from pageable memory may sync the stream
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    it = iter(batches)
    for _ in range(args.warmup):
        images, labels = next(it)
        step(images, labels)
    torch.cuda.synchronize(device)
    wait = 0.0
    n = 0
    with UtilSampler(device.index or 0) as util:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            tw = time.perf_counter()
            images, labels = next(it)
            wait += time.perf_counter() - tw
            n += images.shape[0]
            loss = step(images, labels)
        torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
    r = {"feed": name, "images": n, "seconds": round(dt, 3), "images_per_s": round(n / dt, 1),
         "gpu_util_pct": round(util.mean(), 1), "util_samples": len(util.samples),
         "host_wait_in_next_s": round(wait, 3), "final_loss": round(float(loss), 3)}
    print(json.dumps(r), flush=True)
    return r


def shardkit_feed(args, decoder):
    import shardkit

    ld = shardkit.Loader(args.shards, batch_size=args.batch, shuffle=True, seed=0, device="cuda:0",
                         decoder=decoder, output_size=224, dtype="float32", layout="channels_last",
                         threads=args.threads, drop_last=True)
    print(f"shardkit.Loader: decoder in use = {ld.decoder}, {ld.num_samples} samples, {len(ld)} batches/epoch",
          file=sys.stderr, flush=True)

    def epoch(e):
        ld.set_epoch(e)
        return iter(ld)

    return ld, endless(epoch)


def dataloader_feed(args):
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])
    ds = datasets.ImageFolder(args.folder, transform=tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                     pin_memory=True, persistent_workers=True, drop_last=True, prefetch_factor=4)

    def epoch(e):
        return iter(dl)

    return dl, endless(epoch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, help="shardkit address of the tar shards")
    ap.add_argument("--folder", required=True, help="the same images as an ImageFolder")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="shardkit decoding threads (0 = all)")
    ap.add_argument("--feeds", default="shardkit_auto,dataloader,shardkit_cpu",
                    help="comma list of shardkit_auto, shardkit_cpu, shardkit_gpu, dataloader")
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, {os.cpu_count()} CPUs", file=sys.stderr, flush=True)
    rows = []
    for feed in args.feeds.split(","):
        try:
            if feed.startswith("shardkit_"):
                dec = feed.split("_", 1)[1]
                owner, batches = shardkit_feed(args, dec)
                r = train(f"shardkit (decoder={dec} -> {owner.decoder})", batches, args, device)
            elif feed == "dataloader":
                owner, batches = dataloader_feed(args)
                r = train(f"ImageFolder+DataLoader({args.workers} workers)", batches, args, device)
            else:
                raise ValueError(f"unknown feed {feed!r}")
            rows.append(r)
            if hasattr(owner, "close"):
                owner.close()  # shardkit: stop its decoding threads before the next feed
            del batches, owner
        except Exception as e:  # one failing feed must not hide the others
            print(json.dumps({"feed": feed, "error": f"{type(e).__name__}: {e}"}), flush=True)
            rows.append({"feed": feed, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    ref = next((r["images_per_s"] for r in rows if r["feed"].startswith("ImageFolder") and "images_per_s" in r), None)
    print()
    print(f"ResNet-50 training, batch {args.batch}, bf16 autocast, channels_last, {args.steps} timed steps "
          f"after {args.warmup} warm-up, {torch.cuda.get_device_name(0)}")
    print(f"{'feed':48s} {'images/s':>9s} {'x DataLoader':>12s} {'GPU util %':>10s} {'wait in next() s':>16s}")
    for r in rows:
        if "error" in r:
            print(f"{r['feed']:48s} error: {r['error']}")
            continue
        x = f"{r['images_per_s'] / ref:.2f}" if ref else "-"
        print(f"{r['feed']:48s} {r['images_per_s']:9.1f} {x:>12s} {r['gpu_util_pct']:10.1f} "
              f"{r['host_wait_in_next_s']:16.3f}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
