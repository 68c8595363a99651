#!/usr/bin/env python3
"""MDS interoperability with MosaicML Streaming's own code (issue 18), both directions.

    PYTHONPATH=build/python python3 scripts/mds_streaming_check.py STREAMING_CHECKOUT

STREAMING_CHECKOUT is a source checkout of https://github.com/mosaicml/streaming (its
`streaming/` folder). The package itself cannot be pip-installed here (no PyPI, and its
dependencies pull in torch.distributed, cloud SDKs, brotli, snappy): this script loads
only its MDS modules, unmodified, from the checkout (format/base/{reader,writer}.py,
format/mds/{reader,writer,encodings}.py, compression.py, hashing.py, array.py,
format/index.py) and stands in for what they import and MDS does not use: the cloud
uploader (a local directory), `bytes_to_int`, and the compression libraries other than
zstd (zstd itself is Debian's python3-zstandard behind streaming's `zstd` module API).
Not a CI test (CI cannot fetch the checkout); docs/formats-mds.md has the last result.

Checks:
  1. shardkit writes MDS (plain and zstd, with sha1 and xxh3 hashes) from an image
     folder; streaming's MDSReader reads every sample (decompressing .zstd shards with
     streaming's own compression code, as StreamingDataset does) and the images, labels
     and keys equal the folder's; streaming's get_hash agrees with index.json.
  2. streaming's MDSWriter writes MDS (plain and zstd:7, columns jpeg/int/str/bytes/json);
     shardkit.open("mds:...") reads every sample, byte-identical.
"""
import io
import json
import os
import shutil
import sys
import tempfile
import types
import importlib.util

import numpy as np
from PIL import Image

import shardkit

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
if not os.path.isfile(os.path.join(ROOT, "streaming", "base", "format", "mds", "reader.py")):
    sys.exit(f"{ROOT}: not a checkout of mosaicml/streaming (no streaming/base/format/mds/reader.py)")


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__path__ = []
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load(name, rel):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


# ---- stand-ins for what the MDS modules import but MDS does not use ----
import zstandard  # noqa: E402  (Debian's python3-zstandard)

stub("zstd", compress=lambda data, level=3: zstandard.ZstdCompressor(level=level).compress(data),
     decompress=lambda data: zstandard.ZstdDecompressor().decompress(data))
stub("brotli")
stub("snappy")
if importlib.util.find_spec("xxhash") is None:
    stub("xxhash", algorithms_available=set())


def bytes_to_int(v):
    if isinstance(v, (int, float)):
        return int(v)
    units = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}
    v = v.lower().strip()
    for suffix, mult in units.items():
        if v.endswith(suffix):
            return int(float(v[:-len(suffix)]) * mult)
    return int(v[:-1]) if v.endswith("b") else int(v)


class LocalUploader:  # streaming.base.storage.upload.CloudUploader for a local `out`
    def __init__(self, out):
        self.local, self.remote = out, None
        os.makedirs(out, exist_ok=True)

    @classmethod
    def get(cls, out, keep_local=False, progress_bar=False, retry=2, exist_ok=False):
        return cls(out)

    def upload_file(self, filename):
        pass


for pkg in ("streaming", "streaming.base", "streaming.base.format", "streaming.base.format.base",
            "streaming.base.format.mds", "streaming.base.storage"):
    stub(pkg)
stub("streaming.base.util", bytes_to_int=bytes_to_int)
stub("streaming.base.storage.upload", CloudUploader=LocalUploader)
load("streaming.base.array", "streaming/base/array.py")
compression = load("streaming.base.compression", "streaming/base/compression.py")
hashing = load("streaming.base.hashing", "streaming/base/hashing.py")
load("streaming.base.format.index", "streaming/base/format/index.py")
load("streaming.base.format.base.reader", "streaming/base/format/base/reader.py")
load("streaming.base.format.base.writer", "streaming/base/format/base/writer.py")
load("streaming.base.format.mds.encodings", "streaming/base/format/mds/encodings.py")
MDSReader = load("streaming.base.format.mds.reader", "streaming/base/format/mds/reader.py").MDSReader
MDSWriter = load("streaming.base.format.mds.writer", "streaming/base/format/mds/writer.py").MDSWriter

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def make_folder(root, n=24):
    """An image folder: two classes, JPEG and PNG, odd sizes, one grayscale."""
    rng = np.random.default_rng(7)
    files = {}
    for i in range(n):
        cls = f"class{i % 2}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        h, w = 17 + 5 * i, 23 + 3 * i
        arr = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        img = Image.fromarray(arr).convert("L") if i % 7 == 3 else Image.fromarray(arr)
        ext = "png" if i % 5 == 0 else "jpg"
        buf = io.BytesIO()
        img.save(buf, format="PNG" if ext == "png" else "JPEG", quality=90)
        path = os.path.join(root, cls, f"img{i:03d}.{ext}")
        with open(path, "wb") as f:
            f.write(buf.getvalue())
        files[f"{cls}/img{i:03d}"] = buf.getvalue()
    return files


def streaming_read_all(mds_dir):
    """Every sample of an MDS directory through streaming's MDSReader, in shard order."""
    with open(os.path.join(mds_dir, "index.json")) as f:
        index = json.load(f)
    out = []
    for obj in index["shards"]:
        reader = MDSReader.from_json(mds_dir, None, obj)
        reader.validate(allow_unsafe_types=False)
        raw = os.path.join(mds_dir, reader.raw_data.basename)
        if reader.zip_data is not None:  # what StreamingDataset does before reading a zipped shard
            with open(os.path.join(mds_dir, reader.zip_data.basename), "rb") as f:
                zipped = f.read()
            for algo, want in reader.zip_data.hashes.items():
                if hashing.is_hash(algo):
                    check(hashing.get_hash(algo, zipped) == want, f"{reader.zip_data.basename}: {algo} as index.json says")
            with open(raw, "wb") as f:
                f.write(compression.decompress(reader.compression, zipped))
        with open(raw, "rb") as f:
            data = f.read()
        for algo, want in reader.raw_data.hashes.items():
            if hashing.is_hash(algo):
                check(hashing.get_hash(algo, data) == want, f"{reader.raw_data.basename}: {algo} as index.json says")
        check(len(data) == reader.raw_data.bytes, f"{reader.raw_data.basename}: size as index.json says")
        for i in range(reader.samples):
            out.append(reader.get_item(i))
    return out


def pixels(x):
    img = x if isinstance(x, Image.Image) else Image.open(io.BytesIO(x))
    return np.asarray(img.convert("RGB"))


tmp = tempfile.mkdtemp(prefix="mds-streaming-")
try:
    # ---- 1. shardkit writes, streaming reads ----
    folder = os.path.join(tmp, "images")
    files = make_folder(folder)
    for comp, label in (("", "plain"), ("zstd", "zstd")):
        dst = os.path.join(tmp, f"sk-{label}")
        shardkit.convert(folder, f"mds:{dst}", samples_per_shard=10, mds_compression=comp,
                         mds_hashes=["sha1", "xxh3_64"])
        got = streaming_read_all(dst)
        check(len(got) == len(files), f"shardkit -> MDS ({label}) -> streaming: {len(got)} samples of {len(files)}")
        for s in got:
            key = s["__key__"]
            img = next((s[c] for c in ("jpg", "jpeg", "png") if c in s), None)
            ok = key in files and img is not None and np.array_equal(pixels(img), pixels(files[key]))
            ok = ok and int(s["cls"]) == int(key.startswith("class1"))
            if not ok:
                check(False, f"shardkit -> MDS ({label}) -> streaming: sample {key}")
                break
        else:
            check(True, f"shardkit -> MDS ({label}) -> streaming: every image's pixels, label and key")

    # ---- 2. streaming writes, shardkit reads ----
    rng = np.random.default_rng(3)
    samples = []
    for i in range(30):
        arr = rng.integers(0, 255, (20 + i, 30 + i, 3), dtype=np.uint8)
        samples.append({"jpeg": Image.fromarray(arr), "cls": i % 4, "txt": f"caption {i} é",
                        "raw": bytes(rng.integers(0, 255, 40 + i, dtype=np.uint8)), "meta": {"i": i, "ok": True}})
    columns = {"jpeg": "jpeg", "cls": "int", "txt": "str", "raw": "bytes", "meta": "json"}
    for comp in (None, "zstd:7"):
        dst = os.path.join(tmp, f"st-{comp or 'plain'}")
        with MDSWriter(out=dst, columns=columns, compression=comp, hashes=["sha1"], size_limit=1 << 16) as w:
            for s in samples:
                w.write(s)
        ours = shardkit.open(f"mds:{dst}")
        theirs = streaming_read_all(dst)  # the reference decode of the same files
        check(len(ours) == len(samples), f"streaming MDSWriter ({comp}) -> shardkit: {len(ours)} samples of {len(samples)}")
        bad = None
        for i in range(len(ours)):
            o, t = ours[i], theirs[i]
            same = (np.array_equal(pixels(o["jpeg"]), pixels(t["jpeg"])) and int(o["cls"]) == t["cls"]
                    and o["txt"].decode() == t["txt"] and o["raw"] == t["raw"] and json.loads(o["meta"]) == t["meta"])
            if not same:
                bad = i
                break
        check(bad is None, f"streaming MDSWriter ({comp}) -> shardkit: every column equal (first bad: {bad})")
        info = shardkit.info(f"mds:{dst}")
        check(info.get("samples", len(ours)) == len(samples), f"shardkit info on streaming's MDS ({comp})")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
