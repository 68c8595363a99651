"""Issue 17's loader goal: the Loader fed decoded arrays (HDF5 [N, H, W, 3], an LMDB of
pickled arrays) against the same images as JPEG tar shards, images/s.

    PYTHONPATH=build/python python3 scripts/bench_arrays.py [--n 2000] [--side 256] [--threads 0]

Prints one table row per source (best of --epochs epochs, after one warm-up epoch).
"""
import argparse
import io
import os
import pickle
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    from PIL import Image

    imgs = images(a.n, a.side)
    tmp = tempfile.mkdtemp(prefix="bench_arrays_")
    sources = {}
    # JPEG (quality 90) tar shards.
    jdir = os.path.join(tmp, "jpg")
    os.makedirs(jdir)
    per = 500
    shards = (a.n + per - 1) // per
    for s in range(shards):
        with tarfile.open(os.path.join(jdir, f"j-{s:06d}.tar"), "w") as tf:
            for i in range(s * per, min(a.n, (s + 1) * per)):
                buf = io.BytesIO()
                Image.fromarray(imgs[i]).save(buf, format="JPEG", quality=90)
                for ext, data in (("cls", str(i % 10).encode()), ("jpg", buf.getvalue())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    sources["JPEG q90 tar shards"] = (os.path.join(jdir, "j-{%06d..%06d}.tar" % (0, shards - 1)), {})
    try:
        import h5py

        h5 = os.path.join(tmp, "train.h5")
        with h5py.File(h5, "w") as f:
            f.create_dataset("images", data=imgs)
            f.create_dataset("labels", data=np.arange(a.n) % 10)
        sources["HDF5 uint8 [N,H,W,3] (contiguous)"] = (h5, {})
    except ImportError:
        pass
    try:
        import lmdb

        path = os.path.join(tmp, "train.lmdb")
        env = lmdb.open(path, map_size=imgs.nbytes * 2 + (1 << 26))
        with env.begin(write=True) as txn:
            for i in range(a.n):
                txn.put(f"{i}".encode(), pickle.dumps((imgs[i][:, :, ::-1].copy(), i % 10)))
        env.close()
        sources["LMDB pickle((BGR array, label)), bgr-to-rgb"] = (path, {"lmdb.channels": "bgr-to-rgb"})
        sources["LMDB pickle((array, label)), declared rgb"] = (path, {"lmdb.channels": "rgb"})
    except ImportError:
        pass

    print(f"{a.n} images {a.side}x{a.side}, output 224, float32 NCHW, batch {a.batch}, threads {a.threads or 'all'}")
    print("| source | images/s (best epoch) |")
    print("|---|---|")
    for name, (addr, opts) in sources.items():
        ld = shardkit.Loader(addr, batch_size=a.batch, threads=a.threads, source_options=opts or None)
        best = 0.0
        for e in range(a.epochs + 1):
            ld.set_epoch(e)
            t = time.perf_counter()
            n = 0
            for images_, _ in ld:
                n += images_.shape[0]
            rate = n / (time.perf_counter() - t)
            if e > 0:
                best = max(best, rate)
        print(f"| {name} | {best:.0f} |")


if __name__ == "__main__":
    main()
