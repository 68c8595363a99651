#!/usr/bin/env python3
"""The peer of shardkit's loader benchmark: torchvision ImageFolder + DataLoader.

    python3 scripts/bench_loader_peer.py IMAGE_FOLDER [--workers N] [--batch 256]
                                         [--epochs 3] [--size 224]

Same work as `sk_loader_bench` (c): RandomResizedCrop(size) (scale (0.08, 1), ratio
(3/4, 4/3)), RandomHorizontalFlip, ToTensor, Normalize(ImageNet mean/std), float32 NCHW,
batch 256, `workers` processes, pin_memory, persistent workers. Prints images/s over
the timed epochs (all but the first, which includes the workers' start-up and fills
their prefetch queues, is not timed). Needs torch and torchvision (run it on the GPU machine).
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()

    import torch
    import torchvision
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    # ImageFolder's default loader opens with PIL and converts to RGB (CMYK, gray and the
    # PNG named .JPEG all work).
    ds = datasets.ImageFolder(args.root, transform=tf)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=args.batch, shuffle=True, num_workers=args.workers, pin_memory=True,
        persistent_workers=args.workers > 0, drop_last=False)

    # The first epoch is untimed: the workers start and fill their prefetch queues
    # (prefetch_factor x workers batches, about a whole epoch of a small corpus), which
    # would otherwise be counted as delivered for free. Later epochs are timed whole.
    images = 0
    t0 = None
    for epoch in range(args.epochs):
        if epoch == 1:
            t0 = time.perf_counter()
        for x, y in dl:
            assert x.dtype == torch.float32 and x.shape[1:] == (3, args.size, args.size)
            if t0 is not None:
                images += x.shape[0]
    if t0 is None or images == 0:
        sys.exit("too few epochs to time: --epochs must be at least 2")
    t = time.perf_counter() - t0
    print(f"torchvision {torchvision.__version__} DataLoader: {len(ds)} images, workers {args.workers}, "
          f"batch {args.batch}: {images / t:.1f} images/s ({images} images in {t:.2f} s)")


if __name__ == "__main__":
    main()
