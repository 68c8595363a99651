"""Issue 17 from Python: the GPU-utilisation article's LMDB (pickled BGR arrays) read and
converted with shardkit.convert(source_options=..., encode=...); nothing unpickled by Python."""
import io
import os
import pickle
import tarfile

import numpy as np
import pytest

import shardkit

lmdb = pytest.importorskip("lmdb")


def make_article_lmdb(path, n=12):
    rng = np.random.default_rng(1)
    rgb = [rng.integers(0, 256, (8 + i % 3, 10, 3), dtype=np.uint8) for i in range(n)]
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for idx, img in enumerate(rgb):
            txn.put(f"{idx}".encode(), pickle.dumps((img[:, :, ::-1].copy(), idx % 4)))  # cv2.imread: BGR
    env.close()
    return rgb


def test_article_lmdb_to_npy_and_png(tmp_path):
    src = str(tmp_path / "article.lmdb")
    rgb = make_article_lmdb(src)
    ds = shardkit.open(src)
    assert len(ds) == 12
    out = str(tmp_path / "npy" / "s-%06d.tar")
    shardkit.convert(src, out, source_options={"lmdb.channels": "bgr-to-rgb"})
    with tarfile.open(str(tmp_path / "npy" / "s-000000.tar")) as t:
        m = {x.name: t.extractfile(x).read() for x in t.getmembers()}
    for i in range(12):  # numeric order, RGB as asked, labels kept
        assert np.array_equal(np.load(io.BytesIO(m[f"{i}.npy"])), rgb[i])
        assert int(m[f"{i}.cls"]) == i % 4
    with pytest.raises(Exception, match="BGR"):
        shardkit.convert(src, str(tmp_path / "bad" / "s-%06d.tar"), encode="png")
    shardkit.convert(src, str(tmp_path / "png" / "s-%06d.tar"), source_options={"lmdb.channels": "bgr-to-rgb"},
                     encode="png")
    from PIL import Image

    with tarfile.open(str(tmp_path / "png" / "s-000000.tar")) as t:
        m = {x.name: t.extractfile(x).read() for x in t.getmembers()}
    for i in range(12):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(m[f"{i}.png"]))), rgb[i])
