#!/usr/bin/env python3
"""Peers of shardkit's GPU feed on the same image folder (issue 7), one JSON object per line.

    python3 scripts/bench_gpu_peer.py DIR [--batch 256] [--epochs 2] [--workers 15] [--skip-dataloader]

- torchvision_gpu_decode: torchvision.io.decode_jpeg(list_of_tensors, device="cuda") in
  batches, then per image torchvision.transforms.v2 RandomResizedCrop(224, antialias=True)
  + RandomHorizontalFlip on the GPU, stacked, converted to float and normalized on the GPU.
  nvJPEG (through torchvision) cannot decode CMYK/YCCK JPEGs, and decode_jpeg does not read
  PNG: those files are left out of this peer and counted ("skipped").
- dataloader: torchvision ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip +
  ToTensor + Normalize in a DataLoader (batch 256, 15 workers, pin_memory, persistent
  workers): the work of scripts/bench_loader_peer.py, plus each batch moved to the GPU
  (non_blocking) and waited for. Its first 5 batches (workers starting) are not timed.
The first batch of the torchvision peer is a warm-up and is not timed.
"""
import argparse, json, os, sys, time


def jpeg_components(b):
    """Components of a JPEG's frame header (None if not a JPEG)."""
    if len(b) < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return None
    p = 2
    while p + 4 <= len(b):
        if b[p] != 0xFF:
            return None
        while p < len(b) and b[p] == 0xFF:
            p += 1
        m = b[p]; p += 1
        if m in (0xD8, 0x01) or 0xD0 <= m <= 0xD7:
            continue
        ln = (b[p] << 8) | b[p + 1]
        if 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC):
            return b[p + 7]
        if m == 0xDA:
            return None
        p += ln
    return None


def list_folder(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files = []
    for c, name in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, name))):
            files.append((os.path.join(root, name, f), c))
    return files


def emit(d):
    print(json.dumps(d), flush=True)


def torchvision_gpu(files, batch, epochs):
    import torch, torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2
    datas, skipped = [], 0
    for path, _ in files:
        with open(path, "rb") as f:
            b = f.read()
        if jpeg_components(b) != 3 and jpeg_components(b) != 1:
            skipped += 1  # CMYK/YCCK (4 components) or not a JPEG (the PNG named .JPEG)
            continue
        datas.append(torch.frombuffer(bytearray(b), dtype=torch.uint8))
    dev = torch.device("cuda")
    rrc = v2.RandomResizedCrop(224, antialias=True)
    flip = v2.RandomHorizontalFlip()
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    n, t0, started = 0, None, False
    g = torch.Generator().manual_seed(0)
    for e in range(epochs):
        order = torch.randperm(len(datas), generator=g).tolist()
        for s in range(0, len(order), batch):
            chunk = [datas[i] for i in order[s:s + batch]]
            imgs = decode_jpeg(chunk, device=dev, mode=torchvision.io.ImageReadMode.RGB)
            out = torch.stack([flip(rrc(im)) for im in imgs])
            out = (out.float() - mean) / std
            torch.cuda.synchronize()
            if not started:
                started, t0 = True, time.perf_counter()
                continue
            n += len(chunk)
    dt = time.perf_counter() - t0
    emit({"mode": "torchvision_gpu_decode", "images_per_s": n / dt, "images": n, "seconds": dt,
          "skipped": skipped, "skipped_why": "CMYK/YCCK JPEGs and non-JPEG files (nvJPEG via torchvision cannot decode them)",
          "torch": torch.__version__, "torchvision": torchvision.__version__})


def dataloader(root, batch, epochs, workers):
    import torch, torchvision
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = datasets.ImageFolder(root, tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                                     persistent_workers=True, drop_last=False)
    # As scripts/bench_loader_peer.py: the first 5 batches (workers starting) are not timed.
    n, t0, seen = 0, None, 0
    for e in range(epochs):
        for x, y in dl:
            x = x.cuda(non_blocking=True)
            torch.cuda.synchronize()
            seen += 1
            if seen == 5:
                t0 = time.perf_counter()
                continue
            if t0 is not None:
                n += x.shape[0]
    dt = time.perf_counter() - t0
    emit({"mode": "dataloader", "images_per_s": n / dt, "images": n, "seconds": dt, "workers": workers})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=15)
    ap.add_argument("--skip-dataloader", action="store_true")
    a = ap.parse_args()
    try:
        import torch, torchvision  # noqa: F401
    except Exception as ex:  # the peers need PyTorch
        emit({"mode": "peers", "skipped": f"PyTorch/torchvision not importable: {ex}"})
        return 0
    import torch
    if not torch.cuda.is_available():
        emit({"mode": "peers", "skipped": "torch.cuda.is_available() is False"})
        return 0
    files = list_folder(a.dir)
    try:
        torchvision_gpu(files, a.batch, a.epochs)
    except Exception as ex:
        emit({"mode": "torchvision_gpu_decode", "error": repr(ex)})
    if not a.skip_dataloader:
        try:
            dataloader(a.dir, a.batch, a.epochs, a.workers)
        except Exception as ex:
            emit({"mode": "dataloader", "error": repr(ex)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
