"""shardkit.Loader: a drop-in for a PyTorch DataLoader over a shardkit dataset.

Batches are decoded, augmented and assembled by the C++ library on its own threads;
each yielded images tensor aliases one buffer of the loader's pool (no copy) and that
buffer returns to the pool when the tensor is freed. See docs/python.md.
"""
import gc
import json
import os
from collections import deque

from . import _shardkit

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_DTYPES = ("float32", "float16", "bfloat16", "uint8")
_LAYOUTS = ("NCHW", "NHWC", "channels_last")
_DEFAULT_RRC = ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0))


def _pair(v, name):
    if isinstance(v, (int, float)):
        return (int(v), int(v))
    try:
        a, b = v
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an int or a pair (height, width), not {v!r}") from None
    return (int(a), int(b))


def _range(v, name):
    try:
        lo, hi = v
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max), not {v!r}") from None
    lo, hi = float(lo), float(hi)
    if not lo <= hi:
        raise ValueError(f"{name} must have min <= max, not {v!r}")
    return (lo, hi)


_SOURCE_KEYS = ("address", "weight", "repeat", "choose", "label_offset")


def _is_address(v):
    return isinstance(v, (str, os.PathLike))


def _number(v, what, integer=False):
    import math
    import numbers

    if isinstance(v, bool) or not isinstance(v, numbers.Integral if integer else numbers.Real):
        raise ValueError(f"{what} must be {'an integer' if integer else 'a number'}, not {v!r}")
    if integer:
        v = int(v)
    else:
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"{what} must be finite, not {v!r}")
    if v < 0:
        raise ValueError(f"{what} must be >= 0, not {v!r}")
    return v


def _entry_number(entry, key, default, who, integer=False):
    v = entry.get(key)
    return default if v is None else _number(v, f"{who}: {key}", integer)


def _mixture(source):
    """A Loader's `source` as (address, sources): one dataset's address and no sources, or
    "" and the mixture's (address, weight, repeat, choose, label_offset) per entry."""
    if _is_address(source):
        return os.fspath(source), []
    if isinstance(source, dict):
        raise ValueError("source must be an address or a list of entries; one dict is one entry: "
                         f"wrap it in a list ([{source!r}])")
    if not isinstance(source, (list, tuple)):
        raise ValueError(f"source must be a dataset address or a list of (address, weight) tuples or dicts, "
                         f"not {type(source).__name__} {source!r}")
    if not source:
        raise ValueError("source is an empty list: a mixture needs at least one (address, weight) entry")
    if (isinstance(source, tuple) and len(source) == 2 and _is_address(source[0])
            and not _is_address(source[1]) and not isinstance(source[1], (dict, list, tuple))):
        raise ValueError(f"source {source!r} looks like one (address, weight) entry: a mixture is a list of "
                         f"them ([{source!r}])")
    out = []
    for i, e in enumerate(source):
        who = f"mixture entry {i} ({e!r})"
        if _is_address(e):
            e = {"address": e}
        elif isinstance(e, (tuple, list)):
            if not 1 <= len(e) <= 2:
                raise ValueError(f"{who}: a tuple entry is (address, weight); use a dict for repeat, choose or "
                                 "label_offset")
            e = {"address": e[0], "weight": e[1]} if len(e) == 2 else {"address": e[0]}
        elif not isinstance(e, dict):
            raise ValueError(f"{who}: an entry is an (address, weight) tuple or a dict with keys "
                             f"{', '.join(_SOURCE_KEYS)}, not {type(e).__name__}")
        unknown = sorted(str(k) for k in e if k not in _SOURCE_KEYS)
        if unknown:
            raise ValueError(f"{who}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                             f"(an entry's keys: {', '.join(_SOURCE_KEYS)})")
        if "address" not in e:
            raise ValueError(f"{who}: no address")
        address = e["address"]
        if not _is_address(address) or not os.fspath(address):
            raise ValueError(f"{who}: address must be a non-empty string, not {address!r}")
        weight, repeat = _entry_number(e, "weight", 1.0, who), _entry_number(e, "repeat", 0.0, who)
        choose = _entry_number(e, "choose", 0, who, integer=True)
        label_offset = _entry_number(e, "label_offset", 0, who, integer=True)
        if repeat > 0 and choose > 0:
            raise ValueError(f"{who}: give repeat or choose, not both")
        out.append((os.fspath(address), weight, repeat, choose, label_offset))
    weighted = [w for _, w, r, c, _ in out if r == 0 and c == 0]
    if weighted and sum(weighted) <= 0:
        raise ValueError("mixture: the weights of the entries without repeat or choose add up to 0 "
                         "(give one a weight > 0, or a repeat or choose)")
    return "", out


def _env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


class Loader:
    """Iterates (images, labels) torch tensors, like a DataLoader with a DistributedSampler.

    Arguments (torchvision equivalents in docs/python.md):
      source: a dataset address (tar shards, LMDB, HDF5, MDS, image folder, ...); tar
        shards and manifests may be http(s):// or s3:// addresses (docs/remote.md). Or a
        mixture of datasets read as one epoch: a list of entries, each an address, an
        (address, weight) tuple or a dict with the keys "address", "weight" (default 1),
        "repeat" or "choose" (at most one) and "label_offset" (docs/python.md "Mixtures").
        Entry i gives m_i samples to every epoch: `choose`, or round(repeat * size_i)
        (half to even), or, for the entries with neither, the total size of those entries
        shared by weight (largest remainders). Every source needs random access (no
        `pipe:`, no stream=True). Each batch row's source: return_sources=True. The old
        keyword name `address=` still works.
      cache_dir, cache_bytes: remote shards are downloaded whole on first use into
        cache_dir (bounded by cache_bytes, 0 = unbounded) so that later epochs read local
        disk. None: SHARDKIT_CACHE_DIR / SHARDKIT_CACHE_BYTES when set (read at this call;
        SHARDKIT_INDEX_BUDGET likewise sets the tar shards' index budget).
      trust_manifest: take the files a manifest names as written, even outside its
        directory (absolute paths, '..'; e.g. shards shared by sibling manifests). False
        (default): such entries raise shardkit.Error (docs/reliability.md, "Confinement").
      batch_size, shuffle, seed, drop_last: as DataLoader / DistributedSampler.
      rank, world_size: this process's part; None = torchrun's RANK / WORLD_SIZE
        environment, else 0 / 1. Every rank yields len(loader) batches.
      decoder: "auto" | "cpu" | "gpu". With device="cuda:N" on a build with CUDA, "gpu"
        decodes JPEGs with nvJPEG, "cpu" decodes on the host and copies uint8 to the
        device, "auto" picks "gpu" when the build has nvJPEG, else "cpu". "gpu" raises
        NotImplementedError on a build without CUDA/nvJPEG and with device="cpu".
      device: "cpu" or "cuda:N" (or a torch.device). On a build with CUDA the images
        are CUDA tensors over the library's device ring (no copy), synchronised with the
        current stream through DLPack; labels stay CPU int64 tensors. On a build without
        CUDA the host batch is copied with torch on the current stream (decoder "cpu"/"auto").
      ring: device batches (CUDA builds): how many may exist at once; holding all of them
        while asking for the next waits `buffer_wait`, then raises. None = max(3, prefetch).
      hardware_load: decoder "gpu": the share of the JPEGs the hardware JPEG engines could
        take that they do take (the rest decode on the host threads at the same time), in
        [0, 1]; None = the library's default (0.7). Which image goes where depends on its
        index only.
      profile: decoder "gpu": time where the GPU decode path spends it; read it with
        gpu_profile().
      output_size: int or (height, width) of the output images.
      random_resized_crop: (scale, ratio) ranges of torchvision's RandomResizedCrop, or
        None for evaluation (resize the shorter side to resize_size, center crop).
      center_crop: True selects the evaluation transform whatever random_resized_crop says.
      resize_size: evaluation only: the shorter side before the center crop
        (default output_size * 256 / 224).
      flip: probability of a horizontal flip (True = 0.5, False = 0); training only.
      mean, std: normalization on [0, 1] values (ignored for uint8).
      dtype: "float32" | "float16" | "bfloat16" | "uint8".
      layout: "NCHW", "NHWC", or "channels_last" (NCHW shape over NHWC memory, what
        model.to(memory_format=torch.channels_last) wants).
      threads: decoding threads (0 = the CPUs of this process's affinity mask; under
        torchrun with several ranks on the host and no pinning, this rank's share:
        mask / LOCAL_WORLD_SIZE).
      prefetch: pool buffers = batches decoded ahead + batches you hold. Holding many
        batches at once is allowed up to the pool size; beyond it, iteration waits up to
        `buffer_wait` seconds for a batch to be freed (by another thread), then collects
        garbage, waits once more, and raises shardkit.Error instead of hanging.
      buffer_wait: seconds to wait for a pool buffer (or device ring slot) when every one
        is held (default 10).
      return_keys: yield (images, labels, keys) with keys a list of sample keys (after the
        `fields` lists when there are any: (images, labels, *fields, keys)).
      return_sources: yield each row's source as well, an int64 tensor (CPU) of indices into
        the mixture's entries (all 0 for one dataset), last in the tuple:
        (images, labels, *fields, [keys,] sources).
      fields: extra fields of each sample to yield beside images and labels, by extension,
        e.g. ("txt", "json") for image-text pairs: each batch is then (images, labels,
        txts, jsons), one Python list per field in batch order (row i of each list belongs
        to images[i]), kept aligned through shuffling, ranks, skips and resume.
        Values: "txt"/"text" as str (UTF-8), "json" parsed (json.loads), "cls" as int,
        anything else bytes; decode_fields=False gives bytes for all.
      missing_fields: "raise" (a sample without a requested field fails its batch with
        shardkit.Error naming the field, the sample's key and its shard; on_error="skip"
        skips it instead) or "none" (its value is None).
      source_options: read options of the dataset where its content is ambiguous, as
        shardkit.convert's: e.g. {"lmdb.channels": "bgr-to-rgb"} for an LMDB of pickled
        cv2.imread arrays (BGR). Decoded arrays ("npy" fields: uint8 [H, W], [H, W, 1],
        [H, W, 3]) are cropped, resized and normalised directly, without decoding; arrays
        the source says are BGR are refused until converted or declared RGB.
      on_error: "raise" (a sample that fails to decode raises shardkit.Error naming its
        key) or "skip" (left out of its batch, listed by skipped()).
      image_field: the field to decode (default: the sample's first image field): JPEG,
        PNG, WebP, AVIF or JPEG XL, told apart by their bytes, not their names.
      max_pixels: decompression-bomb guard: an image whose header declares more pixels
        (width * height) is refused before its pixels are allocated, as an image that
        does not decode (on_error applies; the error names its key and WxH). Default
        200_000_000.
      stream: read in order, shard by shard, with a bounded shuffle buffer instead of by
        index (docs/loader.md "Streamed mode"); chosen anyway for a dataset without
        random access (e.g. `pipe:` shards).
      shuffle_buffer: streamed mode: samples held in the shuffle buffer (0 or 1 = only the
        shard order is shuffled).
      prefetch_next_epoch: once an epoch's last batches are submitted, free buffers start
        on the next epoch's (kept by set_epoch(e + 1), dropped by any other set_epoch or
        load_state_dict), so the first batch of an epoch does not wait. Batches are the
        same either way; turn it off for a loader re-run at the same epoch (evaluation).

    Order: the order of epoch e is a pure function of (seed, e) (a mixture: of the seed, e
    and the sources' sizes and counts); call set_epoch(e) before each epoch as with
    DistributedSampler (without it every epoch repeats the same order). Rank r of W takes
    positions r, r + W, ... of that order. Each `for` over the loader runs one epoch from
    its start, except right after load_state_dict(), which continues from the saved
    position, on any number of ranks.
    """

    def __init__(self, source=None, batch_size=256, shuffle=True, seed=0, rank=None, world_size=None,
                 decoder="auto", device="cpu", output_size=224, random_resized_crop=_DEFAULT_RRC,
                 center_crop=False, resize_size=None, flip=True, mean=_IMAGENET_MEAN, std=_IMAGENET_STD,
                 dtype="float32", layout="NCHW", threads=0, prefetch=4, drop_last=False,
                 return_keys=False, on_error="raise", image_field=None, dct_scaling=True, ring=None,
                 buffer_wait=10.0, stream=False, shuffle_buffer=8192, prefetch_next_epoch=True,
                 hardware_load=None, profile=False, cache_dir=None, cache_bytes=0, fields=None,
                 missing_fields="raise", decode_fields=True, source_options=None, trust_manifest=False,
                 max_pixels=200_000_000, return_sources=False, address=None):
        if address is not None:  # the argument's earlier name
            if source is not None:
                raise ValueError("give source (or its old name address), not both")
            source = address
        if source is None:
            raise ValueError("Loader needs a source: a dataset address or a list of (address, weight) entries")
        address, sources = _mixture(source)
        if not _shardkit.HAVE_LOADER:
            raise NotImplementedError("this build of shardkit has no loader")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, not {layout!r}")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if int(shuffle_buffer) < 0:
            raise ValueError("shuffle_buffer must be >= 0")
        if prefetch < 2:
            raise ValueError("prefetch must be at least 2 (one buffer decoding, one held)")
        height, width = _pair(output_size, "output_size")
        train = random_resized_crop is not None and not center_crop
        scale, ratio = _DEFAULT_RRC
        if train:
            try:
                scale, ratio = random_resized_crop
            except (TypeError, ValueError):
                raise ValueError("random_resized_crop must be (scale, ratio) ranges or None") from None
            scale, ratio = _range(scale, "scale"), _range(ratio, "ratio")
        if resize_size is None:
            resize_size = int(round(min(height, width) * 256 / 224))
        flip_p = 0.5 if flip is True else 0.0 if flip is False else float(flip)
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError("flip must be a bool or a probability in [0, 1]")
        mean, std = tuple(float(x) for x in mean), tuple(float(x) for x in std)
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean and std need 3 values (R, G, B)")

        if fields is None:
            fields = ()
        elif isinstance(fields, (str, bytes)):
            fields = (fields,)
        fields = tuple(str(f.decode() if isinstance(f, bytes) else f) for f in fields)
        if missing_fields not in ("raise", "none"):
            raise ValueError(f'missing_fields must be "raise" or "none", not {missing_fields!r}')
        if hardware_load is not None and not 0.0 <= float(hardware_load) <= 1.0:
            raise ValueError(f"hardware_load must be in [0, 1] or None, not {hardware_load!r}")

        self._device = _parse_device(device)
        self._channels_last = layout == "channels_last"
        self._return_keys = bool(return_keys)
        self._return_sources = bool(return_sources)
        self._fields = fields
        self._field_decoders = tuple(_field_decoder(f) if decode_fields else None for f in fields)
        self._address = address
        self._sources = sources
        args = dict(
            batch_size=int(batch_size), shuffle=bool(shuffle), seed=int(seed),
            rank=-1 if rank is None else int(rank), world_size=-1 if world_size is None else int(world_size),
            drop_last=bool(drop_last), threads=int(threads), prefetch=int(prefetch),
            # threads=0: the library's default (docs/loader.md, "Threads"), a share of the
            # machine when torchrun starts several ranks on it.
            local_world_size=_env_int("LOCAL_WORLD_SIZE") or 0,
            output_height=height, output_width=width, train=train, scale=scale, ratio=ratio,
            flip_p=flip_p if train else 0.0, resize_size=int(resize_size), dct_scaling=bool(dct_scaling),
            mean=list(mean), std=list(std), dtype=dtype,
            layout="NHWC" if layout in ("NHWC", "channels_last") else "NCHW",
            on_error=on_error, image_field=image_field or "",
            buffer_wait_ms=max(0, int(float(buffer_wait) * 1000)), stream=bool(stream),
            shuffle_buffer=int(shuffle_buffer), prefetch_next_epoch=bool(prefetch_next_epoch),
            fields=list(fields), missing_fields=missing_fields,
            source_options={str(k): str(v) for k, v in (source_options or {}).items()},
            # Remote shards (http(s)://, s3://; docs/remote.md): an option of the dataset's
            # open, with the environment below it (python/src/loader.cc).
            cache_dir="" if cache_dir is None else str(cache_dir), cache_bytes=int(cache_bytes),
            # Confinement (docs/reliability.md): a manifest's files stay in its directory
            # unless the caller trusts it.
            trust_manifest=bool(trust_manifest), max_pixels=int(max_pixels),
            # A mixture (the address is then ""): one (address, weight, repeat, choose,
            # label_offset) per entry, LoaderOptions::sources.
            sources=sources)
        # The library decides (shardkit/feed.h): device batches (GpuLoader) for
        # device="cuda:N" when it can use the device, else host batches, copied with torch
        # for device="cuda:N"; the decoder; its fallback, reported here as a warning.
        ring = max(3, int(prefetch)) if ring is None else int(ring)
        try:
            self._loader = _shardkit._Loader(
                str(address), device=int(self._device.index or 0) if self._device.type == "cuda" else -1,
                decoder=str(decoder), ring=ring, hardware_load=-1.0 if hardware_load is None
                else float(hardware_load), profile=bool(profile), **args)
        except _shardkit.Error as e:
            if e.code == "unsupported":  # e.g. decoder="gpu" where it cannot run: says why
                raise NotImplementedError(str(e)) from e
            raise
        if self._loader.fallback:
            import warnings

            warnings.warn(f"shardkit: {self._loader.fallback}; copying with torch", RuntimeWarning, stacklevel=2)
        self._gpu = self._loader.on_device
        self._t_first = None
        self._host_wait = 0.0
        self._host_batches = 0
        self._host_images = 0
        self._threads = self._loader.threads  # as the library decided (threads=0: its default)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self._epoch = 0
        self._fresh = True  # the C++ loader stands at the start of an epoch or a restored position
        self._in_flight = deque()  # (cuda event, host tensor) of device copies not yet done

    # --- what a DataLoader offers -------------------------------------------------------
    def __len__(self):
        """Batches this rank yields per epoch (the same on every rank): those of a whole
        epoch at this world size and batch size, also right after load_state_dict() (the
        resumed epoch's own count is batches_left)."""
        n, w, b = self._loader.epoch_size, self._loader.world_size, self.batch_size
        if self.drop_last:
            return (n // w) // b
        return (-(-n // w) + b - 1) // b

    @property
    def batches_left(self):
        """Batches of the current epoch this rank has not yielded yet: len(loader) after
        set_epoch(), 0 once the epoch's `for` is over, and after load_state_dict() what the
        resumed epoch still has for this rank (on another world size or batch size, the new
        ranks' share of the rest of the epoch)."""
        return self._loader.num_batches - self._loader.next_batch

    def __iter__(self):
        if not self._fresh:
            self._loader.set_epoch(self._epoch)  # a new `for` runs the epoch from its start
        self._fresh = False
        return self._batches()

    def set_epoch(self, epoch):
        """Selects the order of the next epoch, as DistributedSampler.set_epoch."""
        self._epoch = int(epoch)
        self._loader.set_epoch(self._epoch)
        self._fresh = True

    def state_dict(self):
        """The position as a dict (JSON-serialisable), for load_state_dict() in a new process:
        the epoch, this rank's next batch and the global position in the epoch's order (the
        samples all ranks together consumed; state version 2)."""
        return {"shardkit_loader": json.loads(self._loader.save_state())}

    def load_state_dict(self, state):
        """Continues from state_dict()'s position: the next `for` yields the batches the
        interrupted run had not yielded yet. Needs the same dataset (or mixture) and seed
        (else shardkit.Error). Ranks move in step, so any rank's state will do (rank 0's).
        With the same world size and batch size every rank continues at its next batch; with
        another world size or batch size the new ranks share what is left of the epoch's
        order from the saved global position, each sample once across the runs before and
        after (drop_last / padding apply to that rest). A state saved before version 2, or
        by a streamed loader, resumes only on the same rank, world size and batch size."""
        s = state["shardkit_loader"] if "shardkit_loader" in state else state
        self._loader.restore(json.dumps(s))
        self._epoch = int(s["epoch"])
        self._fresh = True

    # --- more ----------------------------------------------------------------------------
    @property
    def epoch(self):
        return self._epoch

    @property
    def fields(self):
        """The extra fields each batch carries (the `fields` argument), in yield order."""
        return self._fields

    @property
    def num_samples(self):
        """Samples in the dataset (all ranks); a mixture: in its sources together, each
        counted once (epoch_size says how many an epoch reads)."""
        if self._sources:
            return sum(n for n, _ in self._loader.mixture)
        return self._loader.num_samples

    @property
    def epoch_size(self):
        """Samples of an epoch's order, all ranks together, before padding or dropping: the
        dataset's size, or a mixture's sum of per-source counts."""
        return self._loader.epoch_size

    @property
    def sources(self):
        """A mixture's entries, in the order of `source` (the indices return_sources gives):
        dicts with "address", "weight", "repeat", "choose", "label_offset", "samples" (the
        source's size) and "per_epoch" (its samples in every epoch). [] for one dataset."""
        return [dict(address=a, weight=w, repeat=r, choose=c, label_offset=lo, samples=n, per_epoch=m)
                for (a, w, r, c, lo), (n, m) in zip(self._sources, self._loader.mixture)]

    @property
    def rank(self):
        return self._loader.rank

    @property
    def world_size(self):
        return self._loader.world_size

    @property
    def class_names(self):
        return list(self._loader.class_names)

    @property
    def threads(self):
        """Host decoding threads this loader asked for (threads=, or its default)."""
        return self._threads

    @property
    def decoder(self):
        """The decoder in use: "cpu" or "gpu"."""
        return self._loader.decoder

    def gpu_stats(self):
        """Counters of the GPU feed (dict), or None on the host path."""
        return self._loader.stats() if self._gpu else None

    def input_stats(self):
        """Is the input the bottleneck? A dict: batches, the consumer's wait in next()
        (seconds, and its share of the time since the first batch), images per decoder
        and their rates (images/s over that time), the engines' share of the placement and
        whether it adapts (GPU decode path). See docs/python.md "Is the input the
        bottleneck?"."""
        import time

        now = time.perf_counter()
        t0 = getattr(self, "_t_first", None)
        elapsed = (now - t0) if t0 else 0.0
        if self._gpu:
            s = self._loader.stats()
        else:
            s = {"batches": getattr(self, "_host_batches", 0), "next_wait_s": getattr(self, "_host_wait", 0.0),
                 "images_host": getattr(self, "_host_images", 0), "images_hardware": 0, "images_cuda": 0,
                 "hardware_share": -1.0, "adaptive": False}
        out = {"batches": s["batches"], "elapsed_s": elapsed, "wait_s": s["next_wait_s"],
               "wait_share": (s["next_wait_s"] / elapsed) if elapsed > 0 else 0.0,
               "decoder": self.decoder, "hardware_share": s["hardware_share"], "adaptive": s["adaptive"]}
        for k in ("host", "hardware", "cuda"):
            n = s[f"images_{k}"]
            out[f"images_{k}"] = n
            out[f"rate_{k}"] = n / elapsed if elapsed > 0 else 0.0
        return out

    def summary(self):
        """input_stats() as one line, for a training log."""
        s = self.input_stats()
        line = (f"shardkit: {s['batches']} batches in {s['elapsed_s']:.1f} s, waited {s['wait_s']:.2f} s in next() "
                f"({100 * s['wait_share']:.1f}%: {'input-bound' if s['wait_share'] > 0.05 else 'not input-bound'}); "
                f"decoder {s['decoder']}")
        if s["hardware_share"] >= 0:
            line += (f", engines' share {s['hardware_share']:.2f}{' (adaptive)' if s['adaptive'] else ''}; "
                     f"images/s: engines {s['rate_hardware']:.0f}, host {s['rate_host']:.0f}, "
                     f"CUDA {s['rate_cuda']:.0f}")
        else:
            line += f"; images/s: host {s['rate_host']:.0f}"
        return line

    def gpu_profile(self):
        """Where the GPU decode path spends its time (dict of host seconds per phase and GPU
        milliseconds, summed; "enabled" is False unless profile=True), or None on the host
        path."""
        return self._loader.profile() if self._gpu else None

    @property
    def device(self):
        return self._device

    def skipped(self):
        """With on_error="skip": the samples left out so far this epoch (shardkit.Error each)."""
        return self._loader.skipped()

    def close(self):
        """Stops the decoding threads now (also done when the loader is garbage collected).
        Batches already yielded stay valid."""
        self._in_flight.clear()
        self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        what = (f"mixture of {len(self._sources)} ({', '.join(repr(a) for a, *_ in self._sources)})"
                if self._sources else repr(self._address))
        return (f"<shardkit.Loader {what} batch_size={self.batch_size} "
                f"rank={self.rank}/{self.world_size} batches={len(self)}>")

    # --- internals -----------------------------------------------------------------------
    def _next_raw(self):
        import time

        t = time.perf_counter()
        if self._t_first is None:
            self._t_first = t
        b = self._next_raw_inner()
        if not self._gpu:  # (the device path counts in the library: gpu_stats())
            self._host_wait += time.perf_counter() - t
            if b is not None:
                self._host_batches += 1
                self._host_images += len(b.indices)
        return b

    def _next_raw_inner(self):
        try:
            return self._loader.next()
        except _shardkit.Error as e:
            if e.code != "invalid_argument":
                raise
        # Every pool buffer is held: tensors kept alive by reference cycles may be freed
        # by a collection; otherwise the caller holds `prefetch` batches.
        self._retire_copies(wait=True)
        gc.collect()
        return self._loader.next()

    def _batches(self):
        import torch
        # Device batches: torch.from_dlpack runs here, in the caller's thread, so the
        # stream it passes to __dlpack__ is the caller's current stream at this point.

        while True:
            b = self._next_raw()
            if b is None:
                return
            images = torch.from_dlpack(b.images(self._channels_last))
            labels = torch.from_dlpack(b.labels())
            keys = b.keys if (self._return_keys or self._fields) else None
            extra = self._field_values(b.fields(), keys) if self._fields else []
            if self._return_keys:
                extra.append(keys)
            if self._return_sources:
                extra.append(torch.from_dlpack(b.sources()))
            b.drop()
            del b
            if self._device.type == "cuda" and not self._gpu:
                images, labels = self._to_device(torch, images, labels)
            if extra:
                yield (images, labels, *extra)
            else:
                yield images, labels
            del images, labels  # hold no batch while the consumer's step runs the next call

    def _field_values(self, columns, keys):
        out = []
        for name, dec, col in zip(self._fields, self._field_decoders, columns):
            if dec is None:
                out.append(col)
                continue
            vals = []
            for key, v in zip(keys, col):
                if v is None:
                    vals.append(None)
                    continue
                try:
                    vals.append(dec(v))
                except ValueError as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
                    raise ValueError(f"field {name!r} of sample {key!r} cannot be read as "
                                     f"{_DECODED_AS.get(dec, 'a value')}: {e} (decode_fields=False "
                                     "yields the bytes)") from None
            out.append(vals)
        return out

    def _to_device(self, torch, images, labels):
        # Until device batches come from the library (issue 7): copy on the current
        # stream and keep the host tensor (so its pool buffer) until the copy is done.
        self._retire_copies(wait=False)
        stream = torch.cuda.current_stream(self._device)
        with torch.cuda.stream(stream):
            mf = torch.channels_last if self._channels_last else torch.contiguous_format
            d_images = images.to(self._device, non_blocking=True, memory_format=mf)
            d_labels = labels.to(self._device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        self._in_flight.append((event, images))
        return d_images, d_labels

    def _retire_copies(self, wait):
        while self._in_flight:
            event, _ = self._in_flight[0]
            if wait:
                event.synchronize()
            elif not event.query():
                return
            self._in_flight.popleft()


def _utf8(b):
    return b.decode("utf-8")


def _json(b):
    return json.loads(b.decode("utf-8"))


def _int(b):
    return int(b.decode("ascii").strip())


_DECODED_AS = {_utf8: "UTF-8 text", _json: "JSON", _int: "an integer"}


def _field_decoder(name):
    """How a field's bytes become a Python value (WebDataset's conventions)."""
    if name in ("txt", "text") or name.endswith(".txt"):
        return _utf8
    if name == "json" or name.endswith(".json"):
        return _json
    if name == "cls" or name.endswith(".cls"):
        return _int
    return lambda b: b


def _parse_device(device):
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        d = torch.device(device)
        if d.type == "cuda" and d.index is None and torch.cuda.is_available():
            d = torch.device("cuda", torch.cuda.current_device())
        if d.type not in ("cpu", "cuda"):
            raise ValueError(f'device must be "cpu" or "cuda:N", not {device!r}')
        if d.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")
        return d
    if str(device) != "cpu":
        raise ValueError(f"device {device!r} needs torch")

    class _Cpu:
        type = "cpu"
        index = None

        def __repr__(self):
            return "device(type='cpu')"

    return _Cpu()
