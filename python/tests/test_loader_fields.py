"""Issue 17, the loader side: Loader(fields=...) for image-text pairs, and decoded arrays
(LMDB of pickled cv2 arrays, HDF5 [N, H, W, C]) fed to the loader without decoding,
pixel for pixel as the same images stored as lossless PNG."""
import io
import json
import os
import pickle

import numpy as np
import pytest

import shardkit

from conftest import solid_jpeg, write_tar_shards

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not shardkit.HAVE_LOADER, reason="no loader in this build")


def write_shards(out_dir, items, per_shard):
    """Tar shards of {key: {ext: bytes}} (keys sorted), written by Python's tarfile."""
    return write_tar_shards(out_dir, items, per_shard, prefix="p", mode=None)


def caption(key):
    return f"a photo of {key}, caf\u00e9"  # (not ASCII: str, decoded as UTF-8)


@pytest.fixture
def pairs(tmp_path):
    """23 image-text pairs (jpg, txt, json, cls) in 3 tar shards; sample p0009 has no txt."""
    items = {}
    for i in range(23):
        key = f"p{i:04d}"
        items[key] = {"jpg": solid_jpeg((10 * i, 100, 200 - 5 * i), (24 + i % 3, 20)),
                      "json": json.dumps({"key": key, "i": i}).encode(), "cls": str(i % 4).encode()}
        if i != 9:
            items[key]["txt"] = caption(key).encode()
    return write_shards(str(tmp_path / "pairs"), items, 8)


def loader(address, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("output_size", 16)
    kw.setdefault("threads", 2)
    kw.setdefault("seed", 11)
    return shardkit.Loader(address, **kw)


def check_row(key, txt, js, label):
    assert txt == caption(key)
    assert js == {"key": key, "i": int(key[1:])}
    assert label == int(key[1:]) % 4


def test_image_text_batches_stay_aligned_under_shuffle_and_ranks(pairs):
    seen = []
    for rank in range(2):
        ld = loader(pairs, fields=("txt", "json"), missing_fields="none", rank=rank, world_size=2,
                    return_keys=True)
        ld.set_epoch(3)
        assert ld.fields == ("txt", "json")
        for images, labels, txts, jsons, keys in ld:
            assert len(txts) == len(jsons) == len(keys) == images.shape[0]
            for key, t, j, l in zip(keys, txts, jsons, labels.tolist()):
                if key == "p0009":
                    assert t is None  # missing_fields="none"
                    assert j["key"] == key
                else:
                    check_row(key, t, j, l)
            seen += keys
    assert sorted(set(seen)) == [f"p{i:04d}" for i in range(23)]


def test_for_images_labels_texts_in_loader(pairs):
    ld = loader(pairs, fields="txt", missing_fields="none", shuffle=False)
    texts = []
    for images, labels, t in ld:
        assert isinstance(t, list) and len(t) == images.shape[0]
        texts += t
    assert texts == [None if i == 9 else caption(f"p{i:04d}") for i in range(23)]
    raw = loader(pairs, fields=("txt", "cls"), missing_fields="none", shuffle=False, decode_fields=False)
    _, _, t, c = next(iter(raw))
    assert t[0] == caption("p0000").encode() and c == [b"0", b"1", b"2", b"3"]
    ints = loader(pairs, fields=("cls",), shuffle=False)
    _, labels, c = next(iter(ints))
    assert c == labels.tolist()


@pytest.mark.parametrize("stream", [False, True])
def test_missing_field_raises_naming_key_and_shard(pairs, stream):
    ld = loader(pairs, fields=("txt",), shuffle=False, stream=stream)
    it = iter(ld)
    next(it)
    next(it)
    with pytest.raises(shardkit.Error) as ei:
        next(it)  # rows 8..11: p0009 has no txt
    e = ei.value
    assert e.code == "corrupt"
    assert e.key == "p0009" and e.index == 9 and e.shard == 1
    assert e.file.endswith("p-000001.tar")
    assert "no 'txt' field" in str(e) and "missing_fields" in str(e)
    skip = loader(pairs, fields=("txt",), on_error="skip", stream=stream, return_keys=True)
    keys = [k for _, _, t, ks in skip for k in ks]
    assert sorted(keys) == [f"p{i:04d}" for i in range(23) if i != 9]
    assert [s.key for s in skip.skipped()] == ["p0009"]


def test_fields_resume_with_state_dict(pairs):
    kw = dict(fields=("txt", "json"), missing_fields="none", return_keys=True, seed=5)
    ref = loader(pairs, **kw)
    ref.set_epoch(1)
    full = [(i.clone(), t, j, k) for i, _, t, j, k in ref]
    a = loader(pairs, **kw)
    a.set_epoch(1)
    it = iter(a)
    next(it)
    next(it)
    b = loader(pairs, **kw)
    b.load_state_dict(a.state_dict())
    rest = [(i.clone(), t, j, k) for i, _, t, j, k in b]
    assert len(rest) == len(full) - 2
    for (i, t, j, k), (ri, rt, rj, rk) in zip(rest, full[2:]):
        assert k == rk and t == rt and j == rj and torch.equal(i, ri)


def test_field_argument_errors(pairs, tmp_path):
    with pytest.raises(ValueError):
        loader(pairs, fields=("txt",), missing_fields="maybe")
    with pytest.raises(shardkit.Error) as ei:
        loader(pairs, fields=("txt", "txt"))
    assert ei.value.code == "invalid_argument"
    # A txt that is not UTF-8 names its sample.
    items = {"k0": {"jpg": solid_jpeg((1, 2, 3), (20, 20)), "txt": b"\xff\xfe"}}
    addr = write_shards(str(tmp_path / "bad"), items, 4)
    with pytest.raises(ValueError, match="'k0'"):
        next(iter(loader(addr, fields=("txt",))))


# ---- decoded arrays ------------------------------------------------------------------

def png_shards(out_dir, rgb, labels):
    from PIL import Image

    items = {}
    for i, (a, l) in enumerate(zip(rgb, labels)):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        items[f"{i:04d}"] = {"png": buf.getvalue(), "cls": str(int(l)).encode()}
    return write_shards(out_dir, items, 5)


def all_batches(address, **kw):
    kw.setdefault("dtype", "uint8")
    kw.setdefault("layout", "NHWC")
    ld = loader(address, **kw)
    ld.set_epoch(2)
    return [(i.clone(), l.clone()) for i, l in ld]


def assert_same(a, b):
    assert len(a) == len(b)
    for (ia, la), (ib, lb) in zip(a, b):
        assert torch.equal(la, lb)
        assert torch.equal(ia, ib)


@pytest.mark.parametrize("train", [True, False])
def test_pickled_bgr_arrays_from_lmdb_equal_the_same_images_as_png(tmp_path, train):
    lmdb = pytest.importorskip("lmdb")
    rng = np.random.default_rng(3)
    rgb = [rng.integers(0, 256, (20 + i % 4, 26 - i % 3, 3), dtype=np.uint8) for i in range(13)]
    labels = [i % 5 for i in range(13)]
    src = str(tmp_path / "article.lmdb")
    env = lmdb.open(src, map_size=1 << 26)
    with env.begin(write=True) as txn:  # the GPU-utilisation article's recipe, cv2.imread's BGR
        for idx, (img, l) in enumerate(zip(rgb, labels)):
            txn.put(f"{idx}".encode(), pickle.dumps((img[:, :, ::-1].copy(), l)))
    env.close()
    png = png_shards(str(tmp_path / "png"), rgb, labels)
    kw = {} if train else dict(random_resized_crop=None, resize_size=18)
    with pytest.raises(shardkit.Error, match="bgr-to-rgb") as ei:
        loader(src, **kw)  # BGR arrays: refused until converted or declared RGB
    assert ei.value.code == "invalid_argument"
    ref = all_batches(png, **kw)
    assert_same(all_batches(src, source_options={"lmdb.channels": "bgr-to-rgb"}, **kw), ref)
    # Declared RGB (wrongly, here): taken as they are, so the channels come out swapped.
    swapped = all_batches(src, source_options={"lmdb.channels": "rgb"}, **kw)
    assert torch.equal(swapped[0][0], ref[0][0].flip(-1))
    # float output goes through the same pixels (normalised).
    f_arr = all_batches(src, source_options={"lmdb.channels": "bgr-to-rgb"}, dtype="float32", layout="NCHW", **kw)
    f_png = all_batches(png, dtype="float32", layout="NCHW", **kw)
    assert_same(f_arr, f_png)


@pytest.mark.parametrize("gray", [False, True])
def test_hdf5_decoded_arrays_equal_the_same_images_as_png(tmp_path, gray):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(4)
    imgs = rng.integers(0, 256, (11, 21, 27, 3), dtype=np.uint8)
    if gray:
        imgs = imgs[:, :, :, 0].copy()
    labels = rng.integers(0, 10, 11)
    src = str(tmp_path / "train.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("images", data=imgs, chunks=(1,) + imgs.shape[1:], compression="gzip")
        f.create_dataset("labels", data=labels)
    png = png_shards(str(tmp_path / "png"), list(imgs), labels)
    ref = all_batches(png)
    if not gray:  # h5py records no channel order: colour arrays are refused until it is said
        with pytest.raises(shardkit.Error, match="00000000.*no channel order.*hdf5.channels=rgb"):
            all_batches(src)
    got = all_batches(src, source_options={"hdf5.channels": "rgb"})
    assert_same(got, ref)
    if gray:  # gray comes out as equal R, G, B
        assert torch.equal(got[0][0][..., 0], got[0][0][..., 1])


def test_hdf5_variable_size_arrays_as_vlen_with_shapes(tmp_path):
    """h5py's advice for variable-size arrays: each image flattened into a vlen uint8
    element, its shape in a `shapes` dataset. Read as "npy" arrays, fed to the loader as
    the same pixels stored as PNG."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(6)
    imgs = [rng.integers(0, 256, (18 + i, 25 - i % 4, 3), dtype=np.uint8) for i in range(9)]
    imgs[4] = imgs[4][:, :, 0].copy()  # a gray one, [H, W]
    labels = np.arange(9) % 3
    src = str(tmp_path / "vlen.h5")
    with h5py.File(src, "w") as f:
        ds = f.create_dataset("images", (len(imgs),), dtype=h5py.vlen_dtype(np.uint8))
        for i, a in enumerate(imgs):
            ds[i] = a.ravel()
        f.create_dataset("shapes", data=np.array([a.shape if a.ndim == 3 else a.shape + (1,) for a in imgs]))
        f.create_dataset("labels", data=labels)
    d = shardkit.open(src)
    assert d.info["extra"]["layout"] == "decoded-images-vlen"
    for i, a in enumerate(imgs):
        got = np.load(io.BytesIO(d[i]["npy"]))
        assert np.array_equal(got.reshape(a.shape), a)
    png = png_shards(str(tmp_path / "png"), imgs, labels)
    assert_same(all_batches(src, source_options={"hdf5.channels": "rgb"}), all_batches(png))
    # A shape that does not match its element names it.
    bad = str(tmp_path / "bad.h5")
    with h5py.File(bad, "w") as f:
        ds = f.create_dataset("images", (2,), dtype=h5py.vlen_dtype(np.uint8))
        ds[0] = np.zeros(12, np.uint8)
        ds[1] = np.zeros(11, np.uint8)
        f.create_dataset("shapes", data=np.array([[2, 2, 3], [2, 2, 3]]))
    b = shardkit.open(bad)
    assert len(b[0]["npy"]) > 12
    with pytest.raises(shardkit.Error, match="11 bytes"):
        b[1]


def test_hdf5_encoded_images_beside_a_shapes_dataset_stay_files(tmp_path):
    """`shapes` as metadata beside encoded JPEGs (not a flattening) keeps the images-labels layout."""
    h5py = pytest.importorskip("h5py")
    src = str(tmp_path / "jpegs.h5")
    jpgs = [solid_jpeg((10 * i, 20, 30), (16 + i, 12)) for i in range(3)]
    with h5py.File(src, "w") as f:
        ds = f.create_dataset("images", (3,), dtype=h5py.vlen_dtype(np.uint8))
        for i, j in enumerate(jpgs):
            ds[i] = np.frombuffer(j, np.uint8)
        f.create_dataset("shapes", data=np.array([[12, 16 + i, 3] for i in range(3)]))
        f.create_dataset("labels", data=np.arange(3))
    d = shardkit.open(src)
    assert d.info["extra"]["layout"] == "images-labels"
    assert d[1]["jpg"] == jpgs[1]
