"""Fixtures: small datasets the tests make themselves (PIL JPEGs in class folders)."""
import io
import os
import tarfile

import pytest

import shardkit

CLASSES = ("cat", "dog", "eel")
PER_CLASS = 8


def solid_jpeg(color, size, quality=95):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def color_of(label, i):
    # Distinct solid colours, far from each other, so a pixel identifies its sample.
    return (40 + 60 * label, 30 + 25 * i, 200 - 20 * i)


def make_image_folder(root, classes=CLASSES, per_class=PER_CLASS):
    """root/<class>/img<i>.jpg; returns {key: (path, label, color)}."""
    samples = {}
    for label, cls in enumerate(classes):
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for i in range(per_class):
            size = (48 + 7 * i, 40 + 5 * ((i + label) % 4))
            key = f"{cls}/img{i}"
            path = os.path.join(root, key + ".jpg")
            with open(path, "wb") as f:
                f.write(solid_jpeg(color_of(label, i), size))
            samples[key] = (path, label, color_of(label, i))
    return samples


@pytest.fixture
def folder(tmp_path):
    """An image folder of 3 classes x 8 JPEGs: (address, {key: (path, label, color)})."""
    root = str(tmp_path / "imgs")
    samples = make_image_folder(root)
    try:
        shardkit.open("folder:" + root)
    except shardkit.Error as e:
        if e.code == "unsupported":  # a build whose folder format is not implemented yet
            pytest.skip(f"the folder format is not available: {e}")
        raise
    return "folder:" + root, samples


def write_tar_shards(out_dir, items, per_shard, prefix="train", mode=0o444):
    """Tar shards of {key: {ext: bytes}} (keys sorted, members key.ext), written by
    Python's tarfile as <out_dir>/<prefix>-NNNNNN.tar. Returns the brace-range path."""
    keys = sorted(items)
    os.makedirs(out_dir, exist_ok=True)
    n = (len(keys) + per_shard - 1) // per_shard
    for s in range(n):
        with tarfile.open(os.path.join(out_dir, f"{prefix}-{s:06d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            for key in keys[s * per_shard:(s + 1) * per_shard]:
                for ext in sorted(items[key]):
                    data = items[key][ext]
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    if mode is not None:
                        info.mode = mode
                    tf.addfile(info, io.BytesIO(data))
    return os.path.join(out_dir, f"{prefix}-" + "{%06d..%06d}.tar" % (0, n - 1))


def make_tar_shards(out_dir, samples, per_shard=10, extra=None):
    """WebDataset tar shards of the image folder's samples, written by Python's tarfile
    (members key.jpg, key.cls in key order), plus `extra` {key: {ext: bytes}} samples.
    Returns the wds address."""
    items = {k: {"jpg": open(p, "rb").read(), "cls": str(label).encode()}
             for k, (p, label, _) in samples.items()}
    items.update(extra or {})
    return "wds:" + write_tar_shards(out_dir, items, per_shard)


def _folder_available(address):
    try:
        shardkit.open(address)
    except shardkit.Error as e:
        if e.code == "unsupported":
            return str(e)
        raise
    return None


@pytest.fixture(params=["folder", "tar"])
def data(request, tmp_path):
    """The same 24 samples as an image folder or as tar shards written by Python's
    tarfile: (address, {key: (path of the JPEG, label, color)}, kind)."""
    root = str(tmp_path / "imgs")
    samples = make_image_folder(root)
    if request.param == "folder":
        why = _folder_available("folder:" + root)
        if why:
            pytest.skip(f"the folder format is not available: {why}")
        return "folder:" + root, samples, "folder"
    return make_tar_shards(str(tmp_path / "tar"), samples), samples, "tar"


# Three datasets of different formats with disjoint keys and class names, for mixtures
# (test_mixture.py, test_elastic.py): (name, classes, per class, format of the copy).
MIX_PARTS = (("a", ("cat", "dog", "eel"), 4, "wds"),   # 12 samples, tar shards of 5
             ("b", ("fox", "gnu"), 5, "lmdb"),          # 10 samples, LMDB
             ("c", ("hen", "ibis"), 4, "mds"))          # 8 samples, MDS


def make_mixture_sources(root):
    """Converts three image folders (MIX_PARTS) with shardkit.convert into tar shards, an
    LMDB and an MDS directory. Returns [(address, {key: label within its dataset})]."""
    out = []
    for name, classes, per_class, fmt in MIX_PARTS:
        samples = make_image_folder(os.path.join(root, name), classes=classes, per_class=per_class)
        if fmt == "wds":
            shardkit.convert("folder:" + os.path.join(root, name), "wds:" + os.path.join(root, name + "-%06d.tar"),
                             samples_per_shard=5)
            address = os.path.join(root, name + ".manifest.json")
        else:
            address = f"{fmt}:" + os.path.join(root, f"{name}.{fmt}")
            shardkit.convert("folder:" + os.path.join(root, name), address)
        out.append((address, {k: label for k, (_, label, _) in samples.items()}))
    return out
