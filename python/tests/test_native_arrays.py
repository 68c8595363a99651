"""Issue 17: decoded arrays written to LMDB and HDF5 in their native layouts, read back with
the common scripts' own readers (h5py; py-lmdb + pickle + numpy) and round-tripped back
through shardkit to tar .npy, byte for byte."""
import io
import json
import os
import pickle
import tarfile

import numpy as np
import pytest

import shardkit

from conftest import write_tar_shards

h5py = pytest.importorskip("h5py")
lmdb = pytest.importorskip("lmdb")


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def arrays(n, shape_of, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape_of(i), dtype=np.uint8) for i in range(n)]


def npy_shards(tmp_path, arrs, labels, keys=None, name="src"):
    keys = keys or [f"k/img{i:03d}" for i in range(len(arrs))]
    items = {}
    for k, a, l in zip(keys, arrs, labels):
        items[k] = {"npy": npy_bytes(a)}
        if l is not None:
            items[k]["cls"] = str(l).encode()
    return "wds:" + write_tar_shards(str(tmp_path / name), items, per_shard=7), keys


# Shards written here record no channel order: the arrays are said to be RGB.
RGB = {"wds.channels": "rgb"}


def tar_members(pattern_dir):
    m = {}
    for f in sorted(os.listdir(pattern_dir)):
        if f.endswith(".tar"):
            with tarfile.open(os.path.join(pattern_dir, f)) as t:
                for x in t.getmembers():
                    m[x.name] = t.extractfile(x).read()
    return m


def test_hdf5_native_same_shape_h5py_reads_and_round_trips(tmp_path):
    n = 12
    arrs = arrays(n, lambda i: (6, 9, 3))
    labels = [i % 5 for i in range(n)]
    labels[3] = None  # a sample without label: -1 in `labels`, no cls when read back
    src, keys = npy_shards(tmp_path, arrs, labels)
    h5 = str(tmp_path / "out.h5")
    # Shards that record no channel order: HDF5 would record one, so it must be said.
    with pytest.raises(shardkit.Error, match="k/img000.*no channel order.*wds.channels=rgb"):
        shardkit.convert(src, h5)
    assert not os.path.exists(h5)
    shardkit.convert(src, h5, source_options=RGB)
    with h5py.File(h5, "r") as f:
        img = f["images"]
        assert img.shape == (n, 6, 9, 3) and img.dtype == np.uint8
        assert img.chunks == (1, 6, 9, 3)  # one image per chunk
        assert img.attrs["channel_order"] in ("rgb", b"rgb")
        for i in range(n):
            assert np.array_equal(img[i], arrs[i])
        assert f["labels"].dtype == np.int64
        assert list(f["labels"][:]) == [-1 if l is None else l for l in labels]
        assert [k.decode() for k in f["keys"][:]] == keys
        assert "fields" not in f
    ds = shardkit.open(h5)
    assert ds.info["extra"]["layout"] == "decoded-images"
    back = tmp_path / "back"
    shardkit.convert(h5, str(back / "s-%06d.tar"))
    m = tar_members(str(back))
    for i, k in enumerate(keys):
        assert m[f"{k}.npy"] == npy_bytes(arrs[i])  # byte-identical .npy
        if labels[i] is None:
            assert f"{k}.cls" not in m
        else:
            assert int(m[f"{k}.cls"]) == labels[i]


def test_hdf5_native_variable_shapes_and_gray(tmp_path):
    n = 9
    arrs = arrays(n, lambda i: (4 + i % 3, 5 + i, 3))
    src, keys = npy_shards(tmp_path, arrs, list(range(n)))
    h5 = str(tmp_path / "vlen.h5")
    shardkit.convert(src, h5, source_options=RGB)
    with h5py.File(h5, "r") as f:
        assert f["images"].shape == (n,)
        for i in range(n):
            assert np.array_equal(f["images"][i].reshape(f["shapes"][i]), arrs[i])
        assert list(f["labels"][:]) == list(range(n))
    assert shardkit.open(h5).info["extra"]["layout"] == "decoded-images-vlen"
    back = tmp_path / "vback"
    shardkit.convert(h5, str(back / "s-%06d.tar"))
    m = tar_members(str(back))
    for i, k in enumerate(keys):
        assert m[f"{k}.npy"] == npy_bytes(arrs[i])

    gray = arrays(5, lambda i: (7, 8), seed=3)
    src, keys = npy_shards(tmp_path, gray, [1] * 5, name="gray")
    h5 = str(tmp_path / "gray.h5")
    shardkit.convert(src, h5)
    with h5py.File(h5, "r") as f:
        assert f["images"].shape == (5, 7, 8) and f["images"].chunks == (1, 7, 8)
        assert all(np.array_equal(f["images"][i], gray[i]) for i in range(5))


def test_hdf5_native_refuses_other_fields_fields_layout_keeps_them(tmp_path):
    a = arrays(3, lambda i: (4, 4, 3))
    items = {f"s{i}": {"npy": npy_bytes(a[i]), "cls": b"1"} for i in range(3)}
    items["s1"]["txt"] = b"a caption"
    src = "wds:" + write_tar_shards(str(tmp_path / "mixed"), items, per_shard=10)
    with pytest.raises(shardkit.Error, match="s1.*txt.*--hdf5-arrays fields"):
        shardkit.convert(src, str(tmp_path / "mixed.h5"), source_options=RGB)
    assert not os.path.exists(str(tmp_path / "mixed.h5"))  # nothing half-written
    shardkit.convert(src, str(tmp_path / "fields.h5"), hdf5_arrays="fields", source_options=RGB)
    with h5py.File(str(tmp_path / "fields.h5"), "r") as f:
        assert "fields/npy/data" in f and "fields/txt/data" in f


def test_lmdb_pickle_layout_read_by_the_article_reader(tmp_path):
    n = 12  # keys "10", "11" sort before "2" as bytes
    arrs = arrays(n, lambda i: (5 + i % 2, 7, 3))
    labels = [i % 4 for i in range(n)]
    labels[5] = None
    src, keys = npy_shards(tmp_path, arrs, labels)
    out = str(tmp_path / "out.lmdb")
    shardkit.convert(src, out, source_options=RGB)
    env = lmdb.open(out, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.stat()["entries"] == n  # no side entries: len() as the article's Dataset computes it
        for idx in range(n):
            img, label = pickle.loads(txn.get(f"{idx}".encode()))
            assert img.dtype == np.uint8 and np.array_equal(img, arrs[idx])
            assert label == labels[idx]
    env.close()
    meta = json.load(open(os.path.join(out, "shardkit.json")))
    assert meta["layout"] == "pickle" and meta["channels"] == "rgb" and meta["num_samples"] == n
    ds = shardkit.open(out)
    assert ds.info["extra"]["layout"] == "pickle"
    back = tmp_path / "lback"
    shardkit.convert(out, str(back / "s-%06d.tar"))  # RGB as recorded: no BGR refusal, no conversion
    m = tar_members(str(back))
    for i in range(n):  # keys become the index (documented); arrays byte-identical
        assert m[f"{i}.npy"] == npy_bytes(arrs[i])
        assert (f"{i}.cls" in m) == (labels[i] is not None)
    # the shardkit records stay available
    shardkit.convert(src, str(tmp_path / "rec.lmdb"), lmdb_arrays="record", source_options=RGB)
    assert json.load(open(str(tmp_path / "rec.lmdb" / "shardkit.json")))["layout"] == "shardkit"


def test_bgr_article_lmdb_stays_bgr_and_says_so(tmp_path):
    rng = np.random.default_rng(7)
    bgr = [rng.integers(0, 256, (6, 8, 3), dtype=np.uint8) for _ in range(11)]
    src = str(tmp_path / "article.lmdb")
    env = lmdb.open(src, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for idx, img in enumerate(bgr):
            txn.put(f"{idx}".encode(), pickle.dumps((img, idx % 3)))
    env.close()
    h5 = str(tmp_path / "bgr.h5")
    shardkit.convert(src, h5)
    with h5py.File(h5, "r") as f:
        a = f["images"].attrs["channel_order"]
        assert (a.decode() if isinstance(a, bytes) else a) == "bgr"
        assert all(np.array_equal(f["images"][i], bgr[i]) for i in range(11))  # not converted
        assert [k.decode() for k in f["keys"][:]] == [str(i) for i in range(11)]
    assert "bgr" in shardkit.open(h5).info["extra"]["channel_order"]
    out = str(tmp_path / "copy.lmdb")
    shardkit.convert(src, out)
    assert json.load(open(os.path.join(out, "shardkit.json")))["channels"] == "bgr"
    env = lmdb.open(out, readonly=True, lock=False)
    with env.begin() as txn:
        for idx in range(11):
            img, label = pickle.loads(txn.get(f"{idx}".encode()))
            assert np.array_equal(img, bgr[idx]) and label == idx % 3
    env.close()
    assert "bgr" in shardkit.open(out).info["extra"]["channel_order"]
    # asked to convert on read: RGB arrays, recorded as RGB
    rgb_out = str(tmp_path / "rgb.h5")
    shardkit.convert(src, rgb_out, source_options={"lmdb.channels": "bgr-to-rgb"})
    with h5py.File(rgb_out, "r") as f:
        assert f["images"].attrs["channel_order"] in ("rgb", b"rgb")
        assert np.array_equal(f["images"][4], bgr[4][:, :, ::-1])


def test_lmdb_pickle_layout_other_dtypes_and_labels_python_loads(tmp_path):
    arrs = [np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
            np.arange(300, dtype=">i2").reshape(30, 10),
            np.array([[True, False]]),
            np.arange(24, dtype=np.uint8).reshape(2, 3, 4)]
    labels = [70000, -5, 2 ** 40, None]
    src, _ = npy_shards(tmp_path, arrs, labels)
    out = str(tmp_path / "d.lmdb")
    shardkit.convert(src, out, source_options=RGB)
    env = lmdb.open(out, readonly=True, lock=False)
    with env.begin() as txn:
        for idx, (a, l) in enumerate(zip(arrs, labels)):
            got, label = pickle.loads(txn.get(f"{idx}".encode()))
            # as numpy's own pickle round trip gives it (numpy 1.24 loads '>i2' as '<i2', same values)
            assert got.dtype == pickle.loads(pickle.dumps(a, protocol=4)).dtype
            assert got.shape == a.shape and np.array_equal(got, a)
            assert got.flags["C_CONTIGUOUS"] == a.flags["C_CONTIGUOUS"]  # the Fortran array stays Fortran
            assert label == l
    env.close()
    back = tmp_path / "dback"
    shardkit.convert(out, str(back / "s-%06d.tar"))
    m = tar_members(str(back))
    for i, a in enumerate(arrs):
        assert m[f"{i}.npy"] == npy_bytes(a)


def test_hdf5_bgr_file_channels_option(tmp_path):
    rng = np.random.default_rng(9)
    bgr = [rng.integers(0, 256, (5, 6, 3), dtype=np.uint8) for _ in range(4)]
    src = str(tmp_path / "a.lmdb")
    env = lmdb.open(src, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for idx, img in enumerate(bgr):
            txn.put(f"{idx}".encode(), pickle.dumps((img, 1)))
    env.close()
    h5 = str(tmp_path / "bgr.h5")
    shardkit.convert(src, h5)
    with pytest.raises(shardkit.Error, match="BGR"):  # image files are RGB: refused until told
        shardkit.convert(h5, str(tmp_path / "p" / "s-%06d.tar"), encode="png")
    out = tmp_path / "rgb"
    shardkit.convert(h5, str(out / "s-%06d.tar"), source_options={"hdf5.channels": "bgr-to-rgb"}, encode="png")
    from PIL import Image

    m = tar_members(str(out))
    for i in range(4):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(m[f"{i}.png"]))), bgr[i][:, :, ::-1])
    said = tmp_path / "said"  # "they are RGB": kept as stored, not refused
    shardkit.convert(h5, str(said / "s-%06d.tar"), source_options={"hdf5.channels": "rgb"}, encode="png")
    m = tar_members(str(said))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(m["0.png"]))), bgr[0])
    with pytest.raises(shardkit.Error, match="hdf5.channels"):
        shardkit.convert(h5, str(tmp_path / "x" / "s-%06d.tar"), source_options={"hdf5.channels": "grb"})
