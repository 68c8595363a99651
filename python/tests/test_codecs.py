"""WebP through the loader and verify (written by Pillow, an independent encoder), and
max_pixels= on Loader and verify: an image declaring more is refused with its key and
declared size."""
import io
import os

import pytest

import shardkit

PIL = pytest.importorskip("PIL.Image")
np = pytest.importorskip("numpy")
# A build without libwebp refuses WebP by design (CI builds every codec, so these run there).
pytestmark = pytest.mark.skipif(not shardkit.HAVE_WEBP, reason="this build has no WebP (SHARDKIT_WITH_WEBP=OFF)")


def _folder(root, fmt, ext, **save):
    """root/c<k>/img<i>.<ext>: 2 classes x 2 images of distinct solid colours."""
    for k in range(2):
        os.makedirs(os.path.join(root, f"c{k}"), exist_ok=True)
        for i in range(2):
            buf = io.BytesIO()
            PIL.new("RGB", (40 + 8 * i, 32), (60 + 100 * k, 40 + 80 * i, 90)).save(buf, format=fmt, **save)
            with open(os.path.join(root, f"c{k}", f"img{i}.{ext}"), "wb") as f:
                f.write(buf.getvalue())


def _rows(address, **kw):
    loader = shardkit.Loader(address, batch_size=4, shuffle=False, decoder="cpu", dtype="uint8", layout="NHWC",
                             output_size=16, random_resized_crop=None, **kw)
    out = []
    for images, labels in loader:
        out.append((np.asarray(images).copy(), list(np.asarray(labels))))
    return out, loader


def test_lossless_webp_loads_as_png_does(tmp_path):
    _folder(str(tmp_path / "png"), "PNG", "png")
    _folder(str(tmp_path / "webp"), "WEBP", "webp", lossless=True)
    # A WebP named .jpg: the codec is chosen by the bytes.
    _folder(str(tmp_path / "named"), "WEBP", "jpg", lossless=True)
    want, _ = _rows(f"folder:{tmp_path / 'png'}")
    for d in ("webp", "named"):
        got, _ = _rows(f"folder:{tmp_path / d}")
        assert len(got) == len(want) == 1
        assert (got[0][0] == want[0][0]).all()
        assert got[0][1] == want[0][1]
        r = shardkit.verify(f"folder:{tmp_path / d}", decode=True)
        assert r["ok"], r["findings"]
        assert r["images_decoded"] == 4


def test_max_pixels(tmp_path):
    _folder(str(tmp_path), "WEBP", "webp", quality=90)
    # 40x32 = 1280 and 48x32 = 1536 pixels: a limit of 1300 refuses the img1 of each class.
    rows, loader = _rows(f"folder:{tmp_path}", max_pixels=1300, on_error="skip")
    assert sum(len(r[1]) for r in rows) == 2
    skipped = [str(e) for e in loader.skipped()]
    assert len(skipped) == 2
    assert all("declares 48x32 pixels" in s for s in skipped)
    assert any("c0/img1" in s for s in skipped) and any("c1/img1" in s for s in skipped)
    with pytest.raises(shardkit.Error, match="48x32"):
        _rows(f"folder:{tmp_path}", max_pixels=1300)
    r = shardkit.verify(f"folder:{tmp_path}", decode=True, max_pixels=1300)
    assert r["total_findings"] == 2
    assert {f["key"] for f in r["findings"]} == {"c0/img1", "c1/img1"}
    assert all("declares 48x32 pixels" in f["message"] for f in r["findings"])
    assert shardkit.verify(f"folder:{tmp_path}", decode=True)["ok"]
