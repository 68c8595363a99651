"""Issue 17's loader goal: the Loader fed decoded arrays against the same images as JPEG
tar shards, images/s, and the ratio arrays / JPEG.

Every dataset is made by shardkit itself from one set of tar shards of .npy arrays
(written here with numpy + tarfile), so nothing beyond numpy and the built module is
needed (no py-lmdb, no h5py, no PIL):
  - JPEG q90 tar shards:       shardkit.convert(npy shards, encode="jpeg:90")
  - tar shards of .npy:        the arrays as they are
  - HDF5 images [N, H, W, 3]:  shardkit.convert(npy shards -> .h5), the native layout
  - LMDB pickle((array, label)): shardkit.convert(npy shards -> .lmdb), the native layout
  - with h5py present: also an h5py-written contiguous [N, H, W, 3] file.

    PYTHONPATH=build/python python3 scripts/bench_arrays.py [--n 2000] [--side 256] \
        [--threads 0] [--epochs 3] [--batch 128] [--device cpu|cuda:0]

Prints one row per source (best of --epochs epochs after one warm-up epoch) and its
ratio to the JPEG row.
"""
import argparse
import io
import os
import shutil
import tarfile
import tempfile
import time

import numpy as np

import shardkit


def images(n, side, seed=0):
    """Smooth colour images (JPEG-friendly, like photos rather than noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    out = np.empty((n, side, side, 3), np.uint8)
    for i in range(n):
        f = rng.uniform(1, 6, 3)
        p = rng.uniform(0, 6.3, 3)
        for c in range(3):
            out[i, :, :, c] = (127.5 + 120 * np.sin(f[c] * (x + y * (c + 1)) * 3.1 + p[c])).astype(np.uint8)
    return out


def write_npy_shards(d, imgs, per=500):
    os.makedirs(d)
    n = len(imgs)
    shards = (n + per - 1) // per
    for s in range(shards):
        with tarfile.open(os.path.join(d, f"a-{s:06d}.tar"), "w") as tf:
            for i in range(s * per, min(n, (s + 1) * per)):
                buf = io.BytesIO()
                np.save(buf, imgs[i])
                for ext, data in (("cls", str(i % 10).encode()), ("npy", buf.getvalue())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return os.path.join(d, "a-{%06d..%06d}.tar" % (0, shards - 1))


def rate(addr, a, opts=None):
    kw = {"source_options": opts} if opts else {}
    if a.device != "cpu":
        kw["device"] = a.device
    ld = shardkit.Loader(addr, batch_size=a.batch, threads=a.threads, **kw)
    best = 0.0
    for e in range(a.epochs + 1):
        ld.set_epoch(e)
        t = time.perf_counter()
        n = 0
        for batch in ld:
            n += batch[0].shape[0]
        r = n / (time.perf_counter() - t)
        if e > 0:
            best = max(best, r)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="cpu", help='"cpu" or "cuda:N" (loader output on the GPU)')
    ap.add_argument("--keep", action="store_true", help="keep the temporary datasets")
    a = ap.parse_args()

    imgs = images(a.n, a.side)
    tmp = tempfile.mkdtemp(prefix="bench_arrays_")
    try:
        npy = write_npy_shards(os.path.join(tmp, "npy"), imgs)
        sources = []  # (name, address, source options, is JPEG)
        jpg = os.path.join(tmp, "jpg", "j-%06d.tar")
        rgb = {"wds.channels": "rgb"}  # the .npy shards written here record no channel order
        shardkit.convert("wds:" + npy, "wds:" + jpg, encode="jpeg:90", shard_size="100MiB", overwrite=True,
                         source_options=rgb)
        js = sorted(f for f in os.listdir(os.path.join(tmp, "jpg")) if f.endswith(".tar"))
        sources.append(("JPEG q90 tar shards (baseline)",
                        "wds:" + os.path.join(tmp, "jpg", "j-{%06d..%06d}.tar" % (0, len(js) - 1)), None))
        sources.append(("tar shards of .npy", "wds:" + npy, rgb))
        h5 = os.path.join(tmp, "native.h5")
        shardkit.convert("wds:" + npy, h5, source_options=rgb)
        sources.append(("HDF5 images [N,H,W,3] (shardkit, chunk = 1 image)", h5, None))
        db = os.path.join(tmp, "native.lmdb")
        shardkit.convert("wds:" + npy, db, source_options=rgb)
        sources.append(("LMDB pickle((array, label)) (shardkit)", db, None))
        try:
            import h5py

            h5c = os.path.join(tmp, "h5py.h5")
            with h5py.File(h5c, "w") as f:
                f.create_dataset("images", data=imgs)
                f.create_dataset("labels", data=np.arange(a.n) % 10)
            sources.append(("HDF5 [N,H,W,3] contiguous (h5py)", h5c, {"hdf5.channels": "rgb"}))
        except ImportError:
            pass

        print(f"{a.n} images {a.side}x{a.side}, output 224, float32 NCHW, batch {a.batch}, "
              f"threads {a.threads or 'all'} ({os.cpu_count()} cores), device {a.device}")
        print("| source | images/s (best epoch) | / JPEG |")
        print("|---|---|---|")
        base = None
        for name, addr, opts in sources:
            try:
                r = rate(addr, a, opts)
            except Exception as e:  # one source failing (e.g. a path the device loader lacks) keeps the table
                print(f"| {name} | error: {type(e).__name__}: {str(e)[:160]} | |", flush=True)
                continue
            if base is None:
                base = r
            print(f"| {name} | {r:.0f} | {r / base:.2f}x |", flush=True)
    finally:
        if a.keep:
            print("datasets kept in", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
