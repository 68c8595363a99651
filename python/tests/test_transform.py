"""convert(..., resize=, encode=): images resized, turned upright and re-encoded at
conversion; read back with Pillow, an independent decoder."""
import io
import json
import os

import pytest

import shardkit

PIL = pytest.importorskip("PIL.Image")


def _jpeg(size, color):
    buf = io.BytesIO()
    PIL.new("RGB", size, color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _tar_images(pattern_dir):
    import tarfile
    out = {}
    for name in sorted(os.listdir(pattern_dir)):
        if not name.endswith(".tar"):
            continue
        with tarfile.open(os.path.join(pattern_dir, name)) as t:
            for m in t.getmembers():
                key, ext = m.name.rsplit(".", 1)
                if ext in ("jpg", "png", "webp"):
                    out[key] = (ext, t.extractfile(m).read())
    return out


@pytest.mark.parametrize("encode,ext,fmt", [("", "jpg", "JPEG"), ("webp:80", "webp", "WEBP"), ("png", "png", "PNG")])
def test_resize_and_encode(tmp_path, encode, ext, fmt):
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    if ext == "webp" and not shardkit.HAVE_WEBP:
        pytest.skip("this build has no WebP (SHARDKIT_WITH_WEBP=OFF); CI builds every codec")
    root = tmp_path / "in"
    sizes = {"a/big": (640, 480), "a/tall": (300, 500), "b/small": (120, 90)}
    for key, size in sizes.items():
        os.makedirs(root / key.split("/")[0], exist_ok=True)
        (root / (key + ".jpg")).write_bytes(_jpeg(size, (200, 40, 90)))
    out = tmp_path / "out"
    s = shardkit.convert(str(root), "wds:" + str(out / "t-%06d.tar"), resize="short:128", encode=encode)
    assert s["samples"] == 3
    assert s["transform"] == {"resize": "short:128", "encode": encode or "jpeg:90", "orientation": "applied"}
    manifest = json.loads((out / "t.manifest.json").read_text())
    assert manifest["transform"]["resize"] == "short:128"
    want = {"a/big": (171, 128), "a/tall": (128, 213), "b/small": (120, 90)}  # never enlarged
    got = _tar_images(out)
    assert set(got) == set(want)
    for key, (e, data) in got.items():
        assert e == ext
        im = PIL.open(io.BytesIO(data))
        assert im.format == fmt
        assert im.size == want[key]
        px = im.convert("RGB").getpixel((im.size[0] // 2, im.size[1] // 2))
        assert all(abs(a - b) <= 6 for a, b in zip(px, (200, 40, 90)))


def test_bad_values_and_skip_bad(tmp_path):
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    root = tmp_path / "in"
    os.makedirs(root / "a")
    (root / "a" / "ok.jpg").write_bytes(_jpeg((64, 64), (10, 20, 30)))
    (root / "a" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(shardkit.Error, match="short:0"):
        shardkit.convert(str(root), "wds:" + str(tmp_path / "x/t-%06d.tar"), resize="short:0")
    with pytest.raises(shardkit.Error, match="a/bad"):
        shardkit.convert(str(root), "wds:" + str(tmp_path / "y/t-%06d.tar"), encode="png")
    assert not (tmp_path / "y" / "t.manifest.json").exists()
    s = shardkit.shard(str(root), str(tmp_path / "z/t-%06d.tar"), encode="png", skip_bad=True)
    assert s["samples"] == 1 and s["skipped"] == 1
    skipped = json.loads((tmp_path / "z" / "skipped.json").read_text())
    assert [e["key"] for e in skipped["skipped"]] == ["a/bad"]
    only_ok = tmp_path / "ok"
    os.makedirs(only_ok / "a")
    (only_ok / "a" / "ok.jpg").write_bytes(_jpeg((64, 64), (10, 20, 30)))
    with pytest.raises(shardkit.Error, match="64x64"):
        shardkit.convert(str(only_ok), "wds:" + str(tmp_path / "w/t-%06d.tar"), encode="jpeg:80", max_pixels=1000)


def test_skip_bad_in_parts_and_merge(tmp_path):
    """skip_bad with part=: each part keeps the plan's shards, merge writes skipped.json,
    and the result is the bytes of one process."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    root = tmp_path / "in"
    os.makedirs(root / "a")
    for i in range(5):
        (root / "a" / ("%d.jpg" % i)).write_bytes(_jpeg((64, 48), (10 + 40 * i, 20, 30)))
    for bad in ("2.jpg", "3.jpg"):  # shard 1 of the plan [0, 1] [2, 3] [4]: written empty
        (root / "a" / bad).write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    one = tmp_path / "one"
    s = shardkit.shard(str(root), str(one / "t-%06d.tar"), samples_per_shard=2, resize="max:32", skip_bad=True)
    assert s["samples"] == 3 and s["skipped"] == 2
    assert [sh["samples"] for sh in json.loads((one / "t.manifest.json").read_text())["shards"]] == [2, 0, 1]
    parts = tmp_path / "parts"
    for i in range(2):
        p = shardkit.shard(str(root), str(parts / "t-%06d.tar"), samples_per_shard=2, resize="max:32",
                           skip_bad=True, part=(i, 2))
        assert p.get("skipped", 0) == (0 if i == 0 else 2) and "skipped_file" not in p
    m = shardkit.merge("wds:" + str(parts / "t-%06d.tar"))
    assert m["skipped"] == 2 and m["skipped_file"].endswith("skipped.json")
    for name in sorted(os.listdir(one)):
        assert (parts / name).read_bytes() == (one / name).read_bytes(), name
    # The loader reads past the empty shard, by index and streamed.
    for stream in (False, True):
        keys = []
        for batch in shardkit.Loader(str(one / "t.manifest.json"), batch_size=2, output_size=(16, 16), decoder="cpu",
                                     stream=stream, drop_last=False, return_keys=True):
            keys += list(batch[-1])  # (images, labels, keys)
        assert sorted(keys) == ["a/0", "a/1", "a/4"], stream


def test_select_and_dedup(tmp_path):
    """select= and dedup= choose in source order; duplicates.json and verify(duplicates=True) agree."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    root = tmp_path / "in"
    for c in ("cat", "dog"):
        os.makedirs(root / c)
        for i in range(5):
            (root / c / ("%d.jpg" % i)).write_bytes(_jpeg((32, 24), (10 + 40 * i, 80 if c == "cat" else 160, 30)))
    (root / "dog" / "dup.jpg").write_bytes((root / "cat" / "2.jpg").read_bytes())
    v = shardkit.verify(str(root), duplicates=True)
    assert v["ok"]
    assert v["duplicate_images"] == [{"key": "dog/dup", "duplicate_of": "cat/2"}]
    out = tmp_path / "out"
    s = shardkit.convert(str(root), "wds:" + str(out / "t-%03d.tar"), select="classes=dog", dedup=True)
    assert (s["source_samples"], s["selected"], s["duplicates"], s["samples"]) == (11, 6, 0, 6)
    s = shardkit.shard(str(root), str(out / "u-%03d.tar"), dedup=True, num_shards=2, overwrite=True)
    assert (s["duplicates"], s["samples"]) == (1, 10)
    listed = json.loads((out / "duplicates.json").read_text())
    assert listed["dropped"] == [{"key": "dog/dup", "duplicate_of": "cat/2"}]
    s = shardkit.convert(str(root), "lmdb:" + str(tmp_path / "f.lmdb"), select="fraction=0.5", seed=3)
    assert s["samples"] == 6  # round(0.5 * 11): 5.5 rounds away from zero
    with pytest.raises(shardkit.Error, match="--select"):
        shardkit.convert(str(root), "wds:" + str(tmp_path / "bad/x-%02d.tar"), select="fraction=2")
