"""shardkit: pack training data into shards and feed it to GPUs.

    import shardkit
    ds = shardkit.open("train-{000000..000009}.tar")   # random-access dataset
    ds[0]            # {"__key__": "n01440764/x", "jpg": b"...", "cls": b"0"}
    shardkit.info("train-{000000..000009}.tar")        # metadata dict
    shardkit.convert("folder:/data/imagenet/train", "out/train-%06d.tar", shard_size="1GiB")

    loader = shardkit.Loader("train-{000000..000009}.tar", batch_size=256, seed=0)
    for epoch in range(90):
        loader.set_epoch(epoch)
        for images, labels in loader:   # torch tensors, zero copy
            ...

Errors from the library raise shardkit.Error (a RuntimeError) whose attributes name
the culprit: code, message, file, shard, offset, key, index. See docs/python.md.
"""
from . import _shardkit
from ._shardkit import Dataset, Error, __version__, detect_format, formats, info, open  # noqa: A004

HAVE_CONVERT = _shardkit.HAVE_CONVERT
HAVE_LOADER = _shardkit.HAVE_LOADER

if HAVE_CONVERT:
    from ._shardkit import convert, shard
else:  # the library was built without shardkit/convert.h

    def convert(src, dst, **options):
        """Not available: this build of shardkit has no convert pipeline."""
        raise NotImplementedError("this build of shardkit has no convert pipeline")

    def shard(src, dst, **options):
        """Not available: this build of shardkit has no convert pipeline."""
        raise NotImplementedError("this build of shardkit has no convert pipeline")


HAVE_VERIFY = _shardkit.HAVE_VERIFY

if HAVE_VERIFY:
    from ._shardkit import verify
else:  # the library has no verify API yet (issue 4)

    def verify(address, **options):
        """Not available: this build of shardkit has no verify API (issue 4)."""
        raise NotImplementedError("shardkit.verify is not available: this build of the library has no verify API")


from .loader import Loader  # noqa: E402

__all__ = [
    "Dataset",
    "Error",
    "Loader",
    "convert",
    "detect_format",
    "formats",
    "info",
    "open",
    "shard",
    "verify",
    "__version__",
]
