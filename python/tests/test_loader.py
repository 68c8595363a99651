"""shardkit.Loader: torch tensors through DLPack, order, partition, resume, zero copy."""
import gc
import os

import pytest

import shardkit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not shardkit.HAVE_LOADER, reason="no loader in this build")

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def loader(address, **kw):
    kw.setdefault("batch_size", 5)
    kw.setdefault("output_size", 32)
    kw.setdefault("threads", 2)
    kw.setdefault("seed", 7)
    return shardkit.Loader(address, **kw)


def epoch_keys(ld):
    return [list(keys) for _, _, keys in ld]


def test_shapes_dtypes_and_labels(data):
    address, samples = data[:2]
    ld = loader(address, return_keys=True)
    assert len(ld) == 5  # ceil(24 / 5), last batch partial
    seen = []
    for n, (images, labels, keys) in enumerate(ld):
        rows = 4 if n == 4 else 5
        assert images.shape == (rows, 3, 32, 32)
        assert images.dtype == torch.float32 and images.device.type == "cpu"
        assert images.is_contiguous()
        assert labels.shape == (rows,) and labels.dtype == torch.int64
        assert labels.tolist() == [samples[k][1] for k in keys]
        seen += keys
    assert sorted(seen) == sorted(samples)
    if data[2] == "folder":
        assert ld.class_names == ["cat", "dog", "eel"]
    assert ld.num_samples == 24


@pytest.mark.parametrize("dtype,layout,shape,tdtype", [
    ("uint8", "NHWC", (5, 32, 32, 3), "uint8"),
    ("float16", "NCHW", (5, 3, 32, 32), "float16"),
    ("bfloat16", "NCHW", (5, 3, 32, 32), "bfloat16"),
    ("float32", "NHWC", (5, 32, 32, 3), "float32"),
])
def test_dtypes_and_layouts(data, dtype, layout, shape, tdtype):
    address, _ = data[:2]
    images, labels = next(iter(loader(address, dtype=dtype, layout=layout)))
    assert tuple(images.shape) == shape
    assert images.dtype == getattr(torch, tdtype)
    assert images.is_contiguous()


def test_channels_last_is_nchw_view_of_nhwc_memory(data):
    address, _ = data[:2]
    a, _ = next(iter(loader(address, layout="channels_last", shuffle=False, center_crop=True)))
    b, _ = next(iter(loader(address, layout="NCHW", shuffle=False, center_crop=True)))
    assert a.shape == (5, 3, 32, 32)
    assert a.is_contiguous(memory_format=torch.channels_last)
    assert not a.is_contiguous()
    assert torch.equal(a, b)


def test_pixels_are_normalized_colors(data):
    # Solid-colour JPEGs: every output pixel is the colour, normalized by mean/std.
    address, samples = data[:2]
    ld = loader(address, shuffle=False, center_crop=True, return_keys=True)
    u8 = loader(address, shuffle=False, center_crop=True, return_keys=True, dtype="uint8", layout="NHWC")
    for (images, _, keys), (raw, _, keys2) in zip(ld, u8):
        assert keys == keys2
        for row, key in enumerate(keys):
            color = torch.tensor(samples[key][2], dtype=torch.float32)
            got = raw[row].reshape(-1, 3).float()
            assert (got - color).abs().max() <= 3, key  # JPEG of a flat colour: near exact
            want = (got.mean(0) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
            assert torch.allclose(images[row].mean((1, 2)), want, atol=1e-3), key


def test_eval_order_is_dataset_order(data):
    address, samples = data[:2]
    ld = loader(address, shuffle=False, center_crop=True, return_keys=True)
    keys = sum(epoch_keys(ld), [])
    assert keys == [s["__key__"] for s in shardkit.open(address)]


def test_determinism_same_seed_and_epoch(data):
    address, _ = data[:2]
    a = loader(address, seed=11, return_keys=True)
    b = loader(address, seed=11, return_keys=True, threads=1)
    for x, y in zip(a, b):
        assert x[2] == y[2]
        assert torch.equal(x[0], y[0])  # crops and flips too
        assert torch.equal(x[1], y[1])
    k0 = sum(epoch_keys(a), [])
    assert sum(epoch_keys(a), []) == k0  # a second `for` repeats the epoch
    a.set_epoch(1)
    k1 = sum(epoch_keys(a), [])
    assert sorted(k1) == sorted(k0) and k1 != k0
    c = loader(address, seed=12, return_keys=True)
    assert sum(epoch_keys(c), []) != k0


@pytest.mark.parametrize("world", [2, 3, 5])
def test_rank_partition(data, world):
    address, samples = data[:2]
    parts, lens = [], []
    for rank in range(world):
        ld = loader(address, rank=rank, world_size=world, return_keys=True, drop_last=True, batch_size=2)
        assert (ld.rank, ld.world_size) == (rank, world)
        lens.append(len(ld))
        parts.append(sum(epoch_keys(ld), []))
    assert len(set(lens)) == 1
    flat = sum(parts, [])
    assert len(flat) == len(set(flat))  # disjoint
    assert set(flat) <= set(samples)
    assert len(flat) >= len(samples) - world * 2  # only the drop_last remainder is missing


def test_rank_partition_padded_covers_everything(data):
    address, samples = data[:2]
    parts = []
    for rank in range(5):
        ld = loader(address, rank=rank, world_size=5, return_keys=True, batch_size=2)
        parts.append(sum(epoch_keys(ld), []))
    assert len({len(p) for p in parts}) == 1
    assert set(sum(parts, [])) == set(samples)


def test_rank_defaults_to_torchrun_environment(data, monkeypatch):
    address, _ = data[:2]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ld = loader(address)
    assert (ld.rank, ld.world_size) == (1, 3)
    assert len(ld) == 2  # ceil(ceil(24 / 3) / 5)


def test_state_dict_resume_in_a_new_loader(data):
    address, _ = data[:2]
    ref = loader(address, seed=5, return_keys=True)
    ref.set_epoch(2)
    full = [(i.clone(), l.clone(), k) for i, l, k in ref]
    for stop in (0, 2, 4, 5):
        a = loader(address, seed=5, return_keys=True)
        a.set_epoch(2)
        it = iter(a)
        for _ in range(stop):
            next(it)
        state = a.state_dict()
        assert state["shardkit_loader"]["epoch"] == 2
        b = loader(address, seed=5, return_keys=True)
        b.load_state_dict(state)
        rest = [(i.clone(), l, k) for i, l, k in b]  # list(b) would hold 5 of 4 buffers
        assert len(rest) == len(full) - stop
        for (i, l, k), (ri, rl, rk) in zip(rest, full[stop:]):
            assert k == rk and torch.equal(l, rl) and torch.equal(i, ri)
        assert b.epoch == 2


def test_load_state_dict_refuses_other_settings(data):
    # Another seed or dataset is refused; another batch size or world size is not (the
    # state holds the global position: test_elastic.py).
    address, _ = data[:2]
    state = loader(address, seed=5).state_dict()
    with pytest.raises(shardkit.Error) as ei:
        loader(address, seed=6).load_state_dict(state)
    assert ei.value.code == "invalid_argument" and "seed" in str(ei.value)
    state["shardkit_loader"]["num_samples"] += 1
    with pytest.raises(shardkit.Error) as ei:
        loader(address, seed=5).load_state_dict(state)
    assert ei.value.code == "invalid_argument" and "samples" in str(ei.value)


def test_tensor_aliases_pool_memory(data):
    address, _ = data[:2]
    ld = loader(address, prefetch=3)
    raw = ld._loader.next()
    t = raw.images()
    a = torch.from_dlpack(t)
    assert a.data_ptr() == t.data_ptr  # the tensor is the pool buffer, not a copy
    np = pytest.importorskip("numpy")
    n = np.from_dlpack(t)
    assert n.__array_interface__["data"][0] == t.data_ptr
    a[0, 0, 0, 0] = 123.0  # writes are seen through every alias
    assert n[0, 0, 0, 0] == 123.0


def test_freed_batches_are_reused(data):
    address, _ = data[:2]
    ld = loader(address, prefetch=2, batch_size=2)  # 12 batches through 2 buffers
    ptrs = []
    for images, _ in ld:
        ptrs.append(images.data_ptr())
        del images
    assert len(ptrs) == 12
    assert len(set(ptrs)) <= 2


def test_holding_every_buffer_raises_instead_of_hanging(data):
    address, _ = data[:2]
    ld = loader(address, prefetch=3, batch_size=2, buffer_wait=0.2)
    it = iter(ld)
    held = [next(it), next(it)]  # prefetch - 1 held batches are fine
    held.append(next(it))  # the third one takes the last free buffer
    with pytest.raises(shardkit.Error) as ei:
        next(it)
    assert "held" in str(ei.value)
    labels = [l for _, l in held]
    del held
    gc.collect()
    # Labels are copies: keeping them does not pin the pool.
    it = iter(ld)
    assert sum(1 for _ in it) == 12
    assert len(labels) == 3


def test_iteration_waits_for_a_buffer_freed_by_another_thread(data):
    import threading
    import time

    address, _ = data[:2]
    ld = loader(address, prefetch=3, batch_size=2, buffer_wait=30)
    it = iter(ld)
    held = [next(it), next(it), next(it)]  # every pool buffer is held now

    def free_one():
        time.sleep(0.3)
        held.pop(0)  # the tensors die: their buffer returns to the pool
        gc.collect()

    t = threading.Thread(target=free_one)
    t.start()
    t0 = time.monotonic()
    images, labels = next(it)  # waits (GIL released) until the other thread frees one
    waited = time.monotonic() - t0
    t.join()
    assert waited >= 0.2
    assert images.shape[0] == 2 and labels.shape[0] == 2
    assert len(held) == 2


def test_tensor_outlives_the_loader(data):
    address, _ = data[:2]
    ld = loader(address, shuffle=False, center_crop=True)
    images, _ = next(iter(ld))
    copy = images.clone()
    ld.close()
    del ld
    gc.collect()
    assert torch.equal(images, copy)


def test_unconsumed_capsules_release_their_buffer(data):
    address, _ = data[:2]
    ld = loader(address, prefetch=2, batch_size=2)
    for _ in range(6):
        b = ld._loader.next()
        caps = [b.images().__dlpack__(), b.images().__dlpack__(max_version=(1, 0))]
        b.drop()
        del b, caps  # never consumed: the capsule destructors free the exports
    assert ld._loader.next() is not None


def test_versioned_capsule_name(data):
    import ctypes

    address, _ = data[:2]
    ld = loader(address)
    b = ld._loader.next()
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    assert get_name(b.images().__dlpack__()) == b"dltensor"
    assert get_name(b.images().__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert get_name(b.images().__dlpack__(max_version=(0, 8))) == b"dltensor"
    assert b.images().__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        b.images().__dlpack__(copy=True)


def test_decode_error_raises_with_key(data, tmp_path):
    address, samples, kind = data
    broken = b"\xff\xd8\xff\xe0 this is not a jpeg"
    if kind == "folder":
        with open(os.path.join(address[len("folder:"):], "dog", "broken.jpg"), "wb") as f:
            f.write(broken)
    else:
        from conftest import make_tar_shards

        address = make_tar_shards(str(tmp_path / "tar-broken"), samples,
                                  extra={"dog/broken": {"jpg": broken, "cls": b"1"}})
    ld = loader(address, shuffle=False, return_keys=True)
    got = []
    with pytest.raises(shardkit.Error) as ei:
        for _, _, keys in ld:
            got += keys
    e = ei.value
    assert e.key == "dog/broken", str(e)
    assert "dog/broken" in str(e)
    assert "dog/broken" not in got
    # skip: the epoch goes on without it and reports it.
    sk = loader(address, shuffle=False, return_keys=True, on_error="skip")
    keys = sum(epoch_keys(sk), [])
    assert sorted(keys) == sorted(samples)
    assert [x.key for x in sk.skipped()] == ["dog/broken"]


def test_bad_arguments(data):
    address, _ = data[:2]
    with pytest.raises(ValueError):
        loader(address, dtype="int7")
    with pytest.raises(ValueError):
        loader(address, layout="CHWN")
    with pytest.raises(NotImplementedError):
        loader(address, decoder="gpu")
    with pytest.raises(shardkit.Error) as ei:
        loader("folder:/no/such/dir")
    assert "/no/such/dir" in str(ei.value)


def test_gpu_knobs_are_arguments_not_environment(data):
    address, _ = data[:2]
    # hardware_load (once SHARDKIT_HW_LOAD) is checked up front, whatever the device.
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="hardware_load"):
            loader(address, hardware_load=bad)
    ld = loader(address, hardware_load=0.5, profile=True)  # host path: accepted, unused
    assert ld.gpu_profile() is None and ld.gpu_stats() is None
    assert sum(1 for _ in ld) == len(ld)


def test_load_state_dict_refuses_a_batch_beyond_the_epoch(data):
    address, _ = data[:2]
    ld = loader(address, seed=5)
    state = ld.state_dict()
    state["shardkit_loader"]["next_batch"] = len(ld) + 1
    with pytest.raises(shardkit.Error) as ei:
        loader(address, seed=5).load_state_dict(state)
    assert ei.value.code == "invalid_argument"
    assert "of an epoch of" in str(ei.value)


def test_next_releases_the_gil(data):
    import threading

    address, _ = data[:2]
    # Big outputs on one thread: each batch takes a while to make.
    ld = loader(address, output_size=512, batch_size=24, threads=1, prefetch=2, shuffle=False)
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = count[0]
        b = ld._loader.next()  # waits for the whole batch to be decoded
        during = count[0] - before
    finally:
        stop.set()
        t.join()
    assert b is not None and len(b) == 24
    assert during > 1000, "the Python thread did not run while next() waited"


def test_cuda_device_without_cuda(data):
    address, _ = data[:2]
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeError):
        loader(address, device="cuda:0")


@pytest.mark.parametrize("shuffle_buffer", [0, 4, 64])
def test_streamed_mode_yields_every_sample_once(data, shuffle_buffer):
    address, samples = data[:2]
    ld = loader(address, stream=True, shuffle_buffer=shuffle_buffer, return_keys=True)
    for epoch in range(2):
        ld.set_epoch(epoch)
        keys = sum(epoch_keys(ld), [])
        assert sorted(keys) == sorted(samples)
    # The order is a function of (seed, epoch): a second loader repeats it.
    again = loader(address, stream=True, shuffle_buffer=shuffle_buffer, return_keys=True)
    again.set_epoch(1)
    assert sum(epoch_keys(again), []) == keys


def test_prefetch_next_epoch_changes_nothing(data):
    address, _ = data[:2]
    on = loader(address, return_keys=True, prefetch=3)
    off = loader(address, return_keys=True, prefetch=3, prefetch_next_epoch=False)
    for epoch in (0, 1, 3, 4):  # set_epoch(3) after 1 drops the prefetched epoch 2
        on.set_epoch(epoch)
        off.set_epoch(epoch)
        for x, y in zip(on, off, strict=True):
            assert x[2] == y[2]
            assert torch.equal(x[0], y[0])
            assert torch.equal(x[1], y[1])


def test_stream_option_errors(data):
    address, _ = data[:2]
    with pytest.raises(ValueError, match="shuffle_buffer"):
        loader(address, shuffle_buffer=-1)


def test_input_stats_and_summary_say_whether_the_input_waits(data):
    ld = loader(data[0], batch_size=4, threads=1)
    assert ld.input_stats()["batches"] == 0
    n = 0
    for images, _ in ld:
        n += images.shape[0]
    s = ld.input_stats()
    assert s["batches"] == len(ld)
    assert s["images_host"] == n and s["images_hardware"] == 0 and s["images_cuda"] == 0
    assert s["elapsed_s"] > 0 and 0 <= s["wait_s"] <= s["elapsed_s"]
    assert s["rate_host"] > 0 and s["hardware_share"] < 0
    line = ld.summary()
    assert line.startswith(f"shardkit: {len(ld)} batches") and "decoder cpu" in line and "host" in line


def test_every_default_in_a_fresh_interpreter(data):
    """shardkit.Loader(address, batch_size=...) with every other argument at its default
    (threads=0: the affinity mask; no cache_dir), in a fresh interpreter as a user's script
    runs it: a name bound only on one branch of __init__ once made it fail before the first
    batch (UnboundLocalError) unless threads= or cache_dir= was passed."""
    import subprocess
    import sys
    import textwrap

    address = data[0]
    code = textwrap.dedent(f"""
        import os, shardkit
        os.environ.pop("LOCAL_WORLD_SIZE", None)
        ld = shardkit.Loader({address!r}, batch_size=4, output_size=32)
        assert ld.threads >= 1, ld.threads
        images, labels = next(iter(ld))
        assert tuple(images.shape) == (4, 3, 32, 32), images.shape
        print("defaults-ok", ld.threads)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "defaults-ok" in r.stdout, r.stderr[-2000:]


def test_decoder_gpu_on_a_build_without_cuda_says_which_build(data):
    """A wheel built without CUDA imports anywhere, a GPU machine included, and
    decoder="gpu" says that it needs the CUDA build; "auto" falls back to the host."""
    from shardkit import _shardkit

    if _shardkit.CUDA_COMPILED and _shardkit.NVJPEG_COMPILED:
        pytest.skip("this build has CUDA and nvJPEG (tests/test_cuda.py covers it)")
    address, _, _ = data
    with pytest.raises(NotImplementedError, match="needs the CUDA build of shardkit"):
        shardkit.Loader(address, batch_size=2, decoder="gpu")
