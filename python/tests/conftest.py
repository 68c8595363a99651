"""Fixtures: small datasets the tests make themselves (PIL JPEGs in class folders)."""
import io
import os

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


@pytest.fixture
def shards(tmp_path, folder):
    """The same samples as tar shards (3 of them), made by shardkit.convert."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("this build has no convert pipeline")
    address, samples = folder
    out = tmp_path / "wds"
    out.mkdir()
    shardkit.convert(address, "wds:" + str(out / "train-%06d.tar"), samples_per_shard=10)
    return "wds:" + str(out / "train-{000000..000002}.tar"), samples
