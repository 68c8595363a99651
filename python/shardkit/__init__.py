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


def _preload_pip_cuda_libraries():
    """Loads the CUDA runtime and nvJPEG of pip's nvidia-* wheels, when present, before
    libshardkit, as torch itself does at import.

    A CUDA build of libshardkit needs libcudart.so.N and libnvjpeg.so.N. Loaded first, it
    would bring the system toolkit's copies; torch, imported later, then finds those
    sonames already loaded and uses them instead of the versions its wheel was built
    with, and crashes (issue 13: `import shardkit; import torch` with pip's torch).
    Loading the wheels' copies first makes every library in the process share them.
    A no-op without the wheels (CPU builds, Debian's torch, no torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    import ctypes  # only now: ctypes loads the system's libffi, which a CPU install need not
    import glob
    import os

    for pattern in ("libcudart.so.[0-9]*", "libnvjpeg.so.[0-9]*"):
        for root in spec.submodule_search_locations:
            # nvidia/<pkg>/lib (cu12 wheels) or nvidia/cu13/lib: two levels, no tree walk
            for path in sorted(glob.glob(os.path.join(root, "*", "lib", pattern))):
                if path.rsplit(".so.", 1)[-1].isdigit():  # the soname file, not libx.so.13.0.1
                    try:
                        ctypes.CDLL(path)
                    except OSError:
                        pass


_preload_pip_cuda_libraries()

from . import _shardkit  # noqa: E402
from ._shardkit import Dataset, Error, __version__, detect_format, formats, info, open  # noqa: A004

HAVE_CONVERT = _shardkit.HAVE_CONVERT
HAVE_LOADER = _shardkit.HAVE_LOADER
# Image codecs beyond JPEG and PNG that this build decodes (WebP also encodes).
HAVE_WEBP = _shardkit.HAVE_WEBP
HAVE_AVIF = _shardkit.HAVE_AVIF
HAVE_JXL = _shardkit.HAVE_JXL

if HAVE_CONVERT:
    from ._shardkit import format_options, merge, shard

    def convert(src, dst, **options):
        # Each format's writer options arrive as <format>_<name> keyword arguments, made
        # from the formats' own tables (format_options()): a list is joined with commas (an
        # empty one is "none"), a dict as NAME=VALUE pairs.
        given = dict(options.pop("format_options", None) or {})
        for o in _shardkit.format_options():
            arg = o["format"] + "_" + o["name"]
            if arg not in options:
                continue
            v = options.pop(arg)
            if isinstance(v, dict):
                v = ",".join(f"{k}={x}" for k, x in v.items())
            elif isinstance(v, (list, tuple)):
                v = ",".join(str(x) for x in v) if v else "none"
            given[o["key"]] = str(v)
        return _shardkit.convert(src, dst, format_options=given, **options)

    convert.__doc__ = _shardkit.convert.__doc__
else:  # the library was built without shardkit/convert.h

    def convert(src, dst, **options):
        """Not available: this build of shardkit has no convert pipeline."""
        raise NotImplementedError("this build of shardkit has no convert pipeline")

    def shard(src, dst, **options):
        """Not available: this build of shardkit has no convert pipeline."""
        raise NotImplementedError("this build of shardkit has no convert pipeline")

    def merge(dst, **options):
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
    "merge",
    "detect_format",
    "formats",
    "info",
    "open",
    "shard",
    "verify",
    "__version__",
]
