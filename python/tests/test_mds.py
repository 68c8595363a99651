"""MosaicML Streaming MDS against an independent client.

`streaming` itself cannot be installed here (no PyPI), so this file holds a
minimal MDS writer and reader written from streaming's format (MDSWriter /
MDSReader: index.json version 2, shard.NNNNN.mds = uint32 count, uint32
offsets[count + 1], the config JSON, then per sample the uint32 sizes of the
variable columns and every column's bytes; zstd via python3-zstandard; hashes
via hashlib). It shares no code with shardkit: what it writes shardkit reads,
and what shardkit writes it reads and checks (hashes included).
"""
import hashlib
import io
import json
import os
import struct

import pytest

import shardkit

zstandard = pytest.importorskip("zstandard")

FIXED = {"int": "<q", "int8": "<b", "int16": "<h", "int32": "<i", "int64": "<q", "uint8": "<B",
         "uint16": "<H", "uint32": "<I", "uint64": "<Q", "float32": "<f", "float64": "<d"}


def _encode(encoding, value):
    if encoding in FIXED:
        return struct.pack(FIXED[encoding], value)
    if encoding == "str":
        return value.encode("utf-8")
    if encoding == "json":
        return json.dumps(value).encode("utf-8")
    if encoding in ("bytes", "jpeg", "png"):  # jpeg/png: the image file's bytes
        return bytes(value)
    if encoding == "pil":  # streaming's PIL encoding: width, height, mode length, mode, raw pixels
        mode = value.mode.encode("utf-8")
        return struct.pack("<III", value.size[0], value.size[1], len(mode)) + mode + value.tobytes()
    raise ValueError(encoding)


def _decode(encoding, data):
    if encoding in FIXED:
        return struct.unpack(FIXED[encoding], data)[0]
    if encoding == "str":
        return data.decode("utf-8")
    if encoding == "json":
        return json.loads(data.decode("utf-8"))
    return bytes(data)


def mds_write(out, columns, samples, compression=None, hashes=("md5", "sha1"), size_limit=1 << 26):
    """MDSWriter's behaviour: sorted columns, a shard cut before the sample that would pass
    size_limit (counting the header and 4 bytes per sample), index.json with sorted keys."""
    os.makedirs(out)
    names = sorted(columns)
    encs = [columns[n] for n in names]
    sizes = [struct.calcsize(FIXED[e]) if e in FIXED else None for e in encs]
    config = {"version": 2, "format": "mds", "compression": compression, "hashes": sorted(hashes),
              "size_limit": size_limit, "column_names": names, "column_encodings": encs,
              "column_sizes": sizes}
    config_data = json.dumps(config, sort_keys=True).encode("utf-8")
    shards, cur, cur_size = [], [], 8 + len(config_data)

    def info(basename, data):
        return {"basename": basename, "bytes": len(data),
                "hashes": {h: hashlib.new(h, data).hexdigest() for h in sorted(hashes)}}

    def flush():
        nonlocal cur, cur_size
        n = len(cur)
        offsets, off = [], 4 + 4 * (n + 1) + len(config_data)
        offsets.append(off)
        for s in cur:
            off += len(s)
            offsets.append(off)
        raw = struct.pack("<I", n) + struct.pack(f"<{n + 1}I", *offsets) + config_data + b"".join(cur)
        base = f"shard.{len(shards):05}.mds"
        obj = {"samples": n, "raw_data": info(base, raw), "zip_data": None}
        data = raw
        if compression:
            level = int(compression.split(":")[1]) if ":" in compression else 3
            data = zstandard.ZstdCompressor(level=level).compress(raw)
            base = base + ".zstd"
            obj["zip_data"] = info(base, data)
        with open(os.path.join(out, base), "wb") as f:
            f.write(data)
        obj.update(config)
        shards.append(obj)
        cur, cur_size = [], 8 + len(config_data)

    for sample in samples:
        head, body = [], []
        for n, e, z in zip(names, encs, sizes):
            d = _encode(e, sample[n])
            if z is None:
                head.append(struct.pack("<I", len(d)))
            body.append(d)
        enc = b"".join(head) + b"".join(body)
        if cur and size_limit < cur_size + len(enc) + 4:
            flush()
        cur.append(enc)
        cur_size += len(enc) + 4
    if cur:
        flush()
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"version": 2, "shards": shards}, f, sort_keys=True)


def mds_read(root):
    """MDSReader's behaviour, plus the hash checks streaming makes with validate_hash."""
    with open(os.path.join(root, "index.json")) as f:
        index = json.load(f)
    assert index["version"] == 2
    out = []
    for sh in index["shards"]:
        assert sh["format"] == "mds" and sh["version"] == 2
        stored = sh["zip_data"] or sh["raw_data"]
        with open(os.path.join(root, stored["basename"]), "rb") as f:
            data = f.read()
        assert len(data) == stored["bytes"]
        for algo, digest in stored["hashes"].items():
            if algo in hashlib.algorithms_available:
                assert hashlib.new(algo, data).hexdigest() == digest, (stored["basename"], algo)
        if sh["compression"]:
            assert sh["compression"].split(":")[0] == "zstd"
            data = zstandard.ZstdDecompressor().decompress(data)
        raw = sh["raw_data"]
        assert len(data) == raw["bytes"]
        for algo, digest in raw["hashes"].items():
            if algo in hashlib.algorithms_available:
                assert hashlib.new(algo, data).hexdigest() == digest
        n, = struct.unpack_from("<I", data, 0)
        assert n == sh["samples"]
        offsets = struct.unpack_from(f"<{n + 1}I", data, 4)
        assert offsets[-1] == len(data)
        for i in range(n):
            sample_data = data[offsets[i]:offsets[i + 1]]
            idx, sizes = 0, []
            for size in sh["column_sizes"]:
                if size:
                    sizes.append(size)
                else:
                    sizes.append(struct.unpack_from("<I", sample_data, idx)[0])
                    idx += 4
            sample = {}
            for name, enc, size in zip(sh["column_names"], sh["column_encodings"], sizes):
                sample[name] = _decode(enc, sample_data[idx:idx + size])
                idx += size
            assert idx == len(sample_data)
            out.append(sample)
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("compression", [None, "zstd", "zstd:9"])
def test_shardkit_reads_what_an_independent_mdswriter_writes(tmp_path, folder, compression):
    _, samples = folder
    keys = sorted(samples)
    rows = [{"image": read(samples[k][0]), "label": samples[k][1], "key": k,
             "meta": {"k": k, "n": i}, "weight": 0.25 * i}
            for i, k in enumerate(keys)]
    out = str(tmp_path / "mds")
    mds_write(out, {"image": "jpeg", "label": "int", "key": "str", "meta": "json", "weight": "float64"},
              rows, compression=compression, size_limit=4000)
    assert len(json.load(open(os.path.join(out, "index.json")))["shards"]) > 1
    assert shardkit.open(out).info["format"] == "mds"  # detected by content
    ds = shardkit.open("mds:" + out)
    assert len(ds) == len(keys)
    assert ds.info["format"] == "mds"
    assert set(ds.info["fields"]) == {"jpg", "cls", "meta", "weight"}
    for i, k in enumerate(keys):
        s = ds[i]
        assert s["__key__"] == k
        assert s["jpg"] == rows[i]["image"]
        assert int(s["cls"]) == samples[k][1]
        assert json.loads(s["meta"]) == {"k": k, "n": i}
        assert float(s["weight"]) == 0.25 * i
    assert [s["__key__"] for s in ds] == keys
    report = shardkit.verify("mds:" + out)
    assert report["ok"] is True, report["findings"]
    assert report["shard_checksums"] is True
    # To tar shards and back to MDS: the image bytes and labels survive.
    shardkit.convert("mds:" + out, "wds:" + str(tmp_path / "t-%06d.tar"))
    back = str(tmp_path / "back")
    shardkit.convert("wds:" + str(tmp_path / "t-000000.tar"), "mds:" + back)
    again = mds_read(back)
    assert [r["__key__"] for r in again] == keys
    assert [r["jpg"] for r in again] == [r["image"] for r in rows]
    assert [r["cls"] for r in again] == [r["label"] for r in rows]


@pytest.mark.parametrize("compression", ["", "zstd:5"])
def test_an_independent_reader_reads_what_shardkit_writes(tmp_path, folder, compression):
    address, samples = folder
    out = str(tmp_path / "out.mds")
    summary = shardkit.convert(address, "mds:" + out, samples_per_shard=10, mds_compression=compression,
                               mds_hashes=["md5", "sha1", "xxh64"])
    assert summary["samples"] == len(samples)
    index = json.load(open(os.path.join(out, "index.json")))
    assert [sh["samples"] for sh in index["shards"]] == [10, 10, 4]
    for sh in index["shards"]:
        assert sh["column_names"] == ["__key__", "cls", "jpg"]
        assert sh["column_encodings"] == ["str", "int", "jpeg"]
        assert sh["hashes"] == ["md5", "sha1", "xxh64"]
        assert (sh["compression"] or "") == compression
    got = mds_read(out)  # checks md5 and sha1 of every file
    assert len(got) == len(samples)
    src = shardkit.open(address)
    for i, r in enumerate(got):
        s = src[i]
        assert r["__key__"] == s["__key__"]
        path, label, _ = samples[r["__key__"]]
        assert r["jpg"] == read(path)
        assert r["cls"] == label
    # shardkit's own shard config text is Python's json.dumps(sort_keys=True).
    base = index["shards"][0]["raw_data"]["basename"]
    data = read(os.path.join(out, index["shards"][0]["zip_data"]["basename"] if compression else base))
    if compression:
        data = zstandard.ZstdDecompressor().decompress(data)
    n, = struct.unpack_from("<I", data, 0)
    first, = struct.unpack_from("<I", data, 4)
    config = data[4 + 4 * (n + 1):first]
    cfg = json.loads(config)
    assert config == json.dumps(cfg, sort_keys=True).encode()


def test_loader_reads_mds(tmp_path, folder):
    if not getattr(shardkit, "HAVE_LOADER", False):
        pytest.skip("no loader in this build")
    pytest.importorskip("torch")
    address, samples = folder
    out = str(tmp_path / "l.mds")
    shardkit.convert(address, "mds:" + out, samples_per_shard=7)
    ld = shardkit.Loader("mds:" + out, batch_size=6, output_size=16, threads=2, seed=1, return_keys=True)
    seen = []
    for images, labels, keys in ld:
        assert images.shape[1:] == (3, 16, 16)
        assert labels.tolist() == [samples[k][1] for k in keys]
        seen += keys
    assert sorted(seen) == sorted(samples)


def test_damaged_mds_names_the_file(tmp_path, folder):
    address, _ = folder
    out = str(tmp_path / "d.mds")
    shardkit.convert(address, "mds:" + out, samples_per_shard=10, mds_hashes=["sha1"])
    path = os.path.join(out, "shard.00001.mds")
    data = bytearray(read(path))
    data[-1] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    report = shardkit.verify("mds:" + out)
    assert report["ok"] is False
    assert report["counts"]["shard-checksum"] == 1, report["findings"]
    assert report["findings"][0]["file"] == path
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(shardkit.Error) as ei:
        shardkit.open("mds:" + out)
    assert ei.value.file == path and ei.value.code == "corrupt"


def test_pil_columns_become_png_images(tmp_path):
    from PIL import Image

    imgs = [Image.new(mode, (5 + i, 3 + i), color) for i, (mode, color) in
            enumerate([("RGB", (10, 200, 30)), ("L", 77), ("RGBA", (1, 2, 3, 4))])]
    imgs[0].putpixel((1, 1), (255, 0, 0))
    out = str(tmp_path / "cifar")
    mds_write(out, {"x": "pil", "y": "int"}, [{"x": im, "y": i} for i, im in enumerate(imgs)])
    ds = shardkit.open("mds:" + out)
    assert ds.info["fields"] == ["cls", "png"]
    for i, im in enumerate(imgs):
        s = ds[i]
        assert s["__key__"] == "%08d" % i and int(s["cls"]) == i
        back = Image.open(io.BytesIO(s["png"]))
        assert back.format == "PNG" and back.mode == im.mode and back.size == im.size
        assert back.tobytes() == im.tobytes()
    # A mode shardkit does not convert is an error naming the file, not a wrong image.
    out2 = str(tmp_path / "cmyk")
    mds_write(out2, {"x": "pil"}, [{"x": Image.new("CMYK", (2, 2))}])
    with pytest.raises(shardkit.Error) as ei:
        shardkit.open("mds:" + out2)[0]
    assert ei.value.code == "unsupported" and ei.value.file.endswith("shard.00000.mds")
