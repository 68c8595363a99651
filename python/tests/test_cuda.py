"""shardkit.Loader(device="cuda:N"): CUDA tensors from the library's device ring (GpuLoader).

Runs only where torch sees a CUDA device and this build of shardkit has CUDA
(shardkit._shardkit.CUDA_COMPILED); skipped elsewhere.
"""
import gc

import pytest

import shardkit
from shardkit import _shardkit

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not shardkit.HAVE_LOADER, reason="no loader in this build"),
    pytest.mark.skipif(not _shardkit.CUDA_COMPILED, reason="this build of shardkit has no CUDA"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]


def loader(address, **kw):
    kw.setdefault("batch_size", 5)
    kw.setdefault("output_size", 32)
    kw.setdefault("threads", 2)
    kw.setdefault("seed", 7)
    return shardkit.Loader(address, **kw)


@pytest.fixture
def tar(tmp_path):
    """24 solid-colour JPEGs of 3 classes in tar shards: (address, {key: (path, label, color)})."""
    from conftest import make_image_folder, make_tar_shards

    samples = make_image_folder(str(tmp_path / "imgs"))
    return make_tar_shards(str(tmp_path / "tar"), samples), samples


def test_cuda_tensors_shape_dtype_device(tar):
    address, samples = tar
    ld = loader(address, device="cuda:0", decoder="cpu", return_keys=True)
    assert ld.decoder == "cpu"
    seen = []
    for n, (images, labels, keys) in enumerate(ld):
        rows = 4 if n == 4 else 5
        assert images.device == torch.device("cuda", 0)
        assert images.shape == (rows, 3, 32, 32) and images.dtype == torch.float32
        assert images.is_contiguous()
        assert labels.device.type == "cpu" and labels.dtype == torch.int64
        assert labels.tolist() == [samples[k][1] for k in keys]
        seen += keys
    assert sorted(seen) == sorted(samples)


def test_channels_last_and_bfloat16(tar):
    address, _ = tar
    images, _ = next(iter(loader(address, device="cuda:0", dtype="bfloat16", layout="channels_last")))
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.bfloat16
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_zero_copy_device_pointer(tar):
    address, _ = tar
    ld = loader(address, device="cuda:0", decoder="cpu")
    b = ld._loader.next()
    t = b.images()
    images = torch.from_dlpack(t)
    assert images.data_ptr() == t.data_ptr  # the ring slot itself, no copy


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_same_batches_as_cpu_loader_uint8(tar, layout):
    address, _ = tar
    kw = dict(dtype="uint8", layout=layout, seed=3)
    cpu = [(i.clone(), l.clone()) for i, l in loader(address, **kw)]
    gpu = [(i.cpu(), l.clone()) for i, l in loader(address, device="cuda:0", decoder="cpu", **kw)]
    assert len(cpu) == len(gpu) == 5
    for (ci, cl), (gi, gl) in zip(cpu, gpu):
        assert torch.equal(ci, gi)
        assert torch.equal(cl, gl)


def test_float_batches_close_to_cpu_loader(tar):
    address, _ = tar
    cpu = [i.clone() for i, _ in loader(address, seed=5)]
    gpu = [i.cpu() for i, _ in loader(address, device="cuda:0", decoder="cpu", seed=5)]
    for c, g in zip(cpu, gpu):
        # The copy path normalises the rounded uint8 value, the CPU loader the unrounded
        # filter output: within 0.5 / (255 * min std) (docs/gpu.md).
        assert torch.allclose(c, g, atol=0.0088 + 1e-6)


def test_consumer_on_a_non_default_stream_sees_complete_data(tmp_path):
    # Big batches so that the loader's copy and conversion take a while.
    from conftest import make_image_folder, make_tar_shards

    samples = make_image_folder(str(tmp_path / "imgs"), per_class=16)
    address = make_tar_shards(str(tmp_path / "tar"), samples, per_shard=16)
    kw = dict(batch_size=16, output_size=320, dtype="uint8", layout="NHWC", seed=1, shuffle=False, prefetch=4)
    want = [int(i.long().sum()) for i, _ in loader(address, **kw)]
    s = torch.cuda.Stream()
    assert s.cuda_stream != torch.cuda.default_stream().cuda_stream
    got = []
    with torch.cuda.stream(s):
        for images, _ in loader(address, device="cuda:0", decoder="cpu", **kw):
            # Queued on s right after __dlpack__(stream=s) made s wait for the batch;
            # the tensor is freed at once, so its slot is released on s.
            got.append(images.long().sum())
    s.synchronize()
    got = [int(x) for x in got]
    assert len(got) == 3 and got == want  # uint8 on the copy path: bit-identical


def test_stream_minus_one_and_explicit_sync(tar):
    address, _ = tar
    ld = loader(address, device="cuda:0", decoder="cpu", dtype="uint8", layout="NHWC", shuffle=False)
    ref = [i.clone() for i, _ in loader(address, dtype="uint8", layout="NHWC", shuffle=False)]
    b = ld._loader.next()
    b.synchronize()  # stream=-1 means the consumer synchronises itself
    images = torch.utils.dlpack.from_dlpack(b.images().__dlpack__(stream=-1))
    assert torch.equal(images.cpu(), ref[0])


def test_decoder_gpu_and_auto(tar):
    address, _ = tar
    if not _shardkit.NVJPEG_COMPILED:
        with pytest.raises(NotImplementedError, match="needs the CUDA build of shardkit .built with nvJPEG"):
            loader(address, device="cuda:0", decoder="gpu")
        assert loader(address, device="cuda:0", decoder="auto").decoder == "cpu"
        return
    kw = dict(dtype="uint8", layout="NHWC", shuffle=False, dct_scaling=False)
    ld = loader(address, device="cuda:0", decoder="gpu", **kw)
    assert ld.decoder == "gpu"
    cpu = [i.clone() for i, _ in loader(address, **kw)]
    gpu = [i.cpu() for i, _ in ld]
    assert len(cpu) == len(gpu) == 5
    for c, g in zip(cpu, gpu):
        assert c.shape == g.shape
        # nvJPEG vs libjpeg-turbo: mean absolute difference <= 6 levels per image (docs/gpu.md).
        for ci, gi in zip(c, g):
            assert (ci.float() - gi.float()).abs().mean().item() <= 6
    assert loader(address, device="cuda:0", decoder="auto").decoder == "gpu"


def test_gpu_profile_and_hardware_load_arguments(tar):
    address, _ = tar
    decoder = "gpu" if _shardkit.NVJPEG_COMPILED else "cpu"
    # (prefetch_next_epoch off: else the batches started include the next epoch's)
    ld = loader(address, device="cuda:0", decoder=decoder, hardware_load=1.0, profile=True,
                prefetch_next_epoch=False)
    n = sum(1 for _ in ld)
    p = ld.gpu_profile()
    assert set(p) >= {"enabled", "batches", "phase1_s", "gpu_hw_decode_ms", "gpu_resize_ms", "rows_nvjpeg_s",
                      "rows_host_s"}
    if decoder == "gpu":
        assert p["enabled"] and p["batches"] == n and p["phase1_s"] > 0
        assert p["rows_nvjpeg_s"] + p["rows_host_s"] > 0
    else:
        assert not p["enabled"] and p["batches"] == 0  # the copy path has no producer phases
    assert not loader(address, device="cuda:0", decoder=decoder).gpu_profile()["enabled"]


def test_ring_slots_reused_device_memory_flat(tar):
    address, _ = tar
    ld = loader(address, device="cuda:0", batch_size=4, output_size=224, prefetch=3)
    torch.cuda.synchronize()
    free = []
    for epoch in range(3):
        ld.set_epoch(epoch)
        for images, labels in ld:
            images.mul(2).sum().item()  # use it on the current stream
        torch.cuda.synchronize()
        gc.collect()
        free.append(torch.cuda.mem_get_info(0)[0])
    slots = set()
    ld.set_epoch(3)
    for _ in range(20):
        b = ld._loader.next()
        if b is None:
            ld.set_epoch(ld.epoch + 1)
            continue
        slots.add(b.slot)
        del b  # released at once: the ring goes round
    assert 2 <= len(slots) and slots <= {0, 1, 2}  # 20 batches in the ring of 3 slots
    # The ring is allocated once at creation: free memory does not move between epochs
    # (16 MiB of slack for the driver and torch's own kernels).
    assert max(free) - min(free) <= 16 << 20, free


def test_holding_the_whole_ring_raises_instead_of_hanging(tar):
    address, _ = tar
    ld = loader(address, device="cuda:0", prefetch=3, ring=3)
    it = iter(ld)
    held = [next(it) for _ in range(3)]  # the whole ring
    with pytest.raises(shardkit.Error):
        next(it)
    del held


@pytest.mark.parametrize("decoder", ["cpu", "gpu"])
def test_fields_and_decoded_arrays_on_the_device_paths(tmp_path, decoder):
    """Issue 17: fields ride with their rows on the copy path and the GPU decode path;
    decoded arrays (HDF5 [N, H, W, 3]) take the GPU path's host route (no nvJPEG)."""
    if decoder == "gpu" and not _shardkit.NVJPEG_COMPILED:
        pytest.skip("no nvJPEG in this build")
    import io
    import os
    import tarfile

    import numpy as np
    from conftest import make_image_folder

    samples = make_image_folder(str(tmp_path / "imgs"))
    shard = str(tmp_path / "p-000000.tar")
    with tarfile.open(shard, "w") as tf:  # jpg + cls + txt per sample
        for key in sorted(samples):
            for ext, data in (("cls", str(samples[key][1]).encode()), ("jpg", open(samples[key][0], "rb").read()),
                              ("txt", f"text {key}".encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    n = 0
    for images, labels, texts, keys in loader(shard, device="cuda:0", decoder=decoder, fields=("txt",),
                                              return_keys=True):
        assert images.device.type == "cuda"
        assert texts == [f"text {k}" for k in keys]
        assert labels.tolist() == [samples[k][1] for k in keys]
        n += len(keys)
    assert n == 24
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(2)
    src = str(tmp_path / "a.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (10, 20, 24, 3), dtype=np.uint8))
        f["images"].attrs["channel_order"] = "rgb"  # the loader refuses colour arrays of unknown order
        f.create_dataset("labels", data=np.arange(10))
    kw = dict(dtype="uint8", layout="NHWC", seed=3)
    cpu = [i.clone() for i, _ in loader(src, **kw)]
    gpu = [i.cpu() for i, _ in loader(src, device="cuda:0", decoder=decoder, **kw)]
    assert len(cpu) == len(gpu) == 2
    for c, g in zip(cpu, gpu):
        # bit-identical: the copy path, and the GPU path's host route (docs/gpu.md)
        assert torch.equal(c, g)


def test_threads_reports_the_librarys_default_on_each_path(tar):
    """threads=0 on a GPU loader: the CPUs minus one for the training thread, minus one more
    on the GPU decode path (its submitter); `threads` says what the library uses."""
    import os

    address, _ = tar
    cpus = len(os.sched_getaffinity(0))
    if cpus < 4 or os.environ.get("LOCAL_WORLD_SIZE"):
        pytest.skip("needs 4+ CPUs and no launcher's share")
    assert loader(address, device="cuda:0", decoder="cpu", threads=0).threads == cpus - 1
    if _shardkit.NVJPEG_COMPILED:
        ld = loader(address, device="cuda:0", decoder="gpu", threads=0)
        assert ld.decoder == "gpu" and ld.threads == cpus - 2


def test_gpu_decode_path_makes_the_next_epoch_ahead(tar):
    """set_epoch(e + 1) after an epoch's end keeps the batches made ahead; they equal a
    fresh loader's epoch e + 1 (hardware_load pinned: placement is a function of the index)."""
    import time

    address, _ = tar

    def epoch_of(ld):
        return [(keys, images.float().cpu()) for images, _, keys in ld]

    ld = loader(address, device="cuda:0", decoder="gpu", hardware_load=0.5, ring=3, return_keys=True)
    first = epoch_of(ld)
    for _ in range(3000):  # up to 30 s for the ring's 3 slots
        if ld.gpu_stats()["next_epoch_ready"] >= 3:
            break
        time.sleep(0.01)
    assert ld.gpu_stats()["next_epoch_ready"] == 3
    ld.set_epoch(1)
    assert ld.gpu_stats()["next_epoch_adopted"] == 3
    second = epoch_of(ld)
    fresh = loader(address, device="cuda:0", decoder="gpu", hardware_load=0.5, return_keys=True)
    fresh.set_epoch(1)
    want = epoch_of(fresh)
    assert [k for k, _ in second] == [k for k, _ in want]
    assert [k for k, _ in second] != [k for k, _ in first]  # another order
    for (_, a), (_, b) in zip(second, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("decoder", ["cpu", "gpu"])
def test_a_mixture_on_the_device_paths(tmp_path, decoder):
    # decoder "cpu" decodes a mixture on the host and copies it, "gpu" with nvJPEG; the
    # rows, their sources (DeviceBatch::sources()) and labels equal the CPU loader's (and
    # the copy path's uint8 pixels too), and a state saved on the device resumes on the
    # host on another world size.
    if decoder == "gpu" and not _shardkit.NVJPEG_COMPILED:
        pytest.skip("this build of shardkit has no nvJPEG")
    from conftest import make_mixture_sources

    parts = make_mixture_sources(str(tmp_path / "mix"))
    entries = [(parts[0][0], 2), {"address": parts[1][0], "repeat": 2, "label_offset": 3}, parts[2][0]]
    kw = dict(batch_size=4, output_size=16, dtype="uint8", layout="NHWC", rank=0, world_size=1,
              return_keys=True, return_sources=True)
    dev = loader(entries, device="cuda:0", decoder=decoder, **kw)
    assert dev.decoder == decoder and dev.epoch_size == 13 + 20 + 7  # 20 shared 2:1, largest remainder
    if decoder == "gpu":
        assert loader(entries, device="cuda:0", decoder="auto", **kw).decoder == "gpu"
    host = loader(entries, **kw)
    n = 0
    for (di, dl, dk, ds), (hi, hl, hk, hs) in zip(dev, host):
        assert di.device.type == "cuda" and dk == hk
        assert torch.equal(ds, hs) and torch.equal(dl, hl)
        if decoder == "cpu":
            assert torch.equal(di.cpu(), hi)
        assert all(k in parts[s][1] for k, s in zip(dk, ds.tolist()))
        n += 1
    assert n == len(dev) == len(host)
    dev.set_epoch(1)
    it = iter(dev)
    next(it)
    state = dev.state_dict()
    assert state["shardkit_loader"]["position"] == 4
    del it
    resumed = [loader(entries, **dict(kw, rank=r, world_size=2)) for r in range(2)]
    for ld in resumed:
        ld.load_state_dict(state)
    assert [ld.batches_left for ld in resumed] == [5, 5]  # 36 left: 18 each


@pytest.mark.parametrize("decoder", ["gpu", "cpu"])
def test_elastic_resume_on_the_device_paths(tar, decoder):
    # A state of 2 ranks of batch 5 resumes on 3 ranks of batch 2, on the nvJPEG decode
    # path and the copy path alike: each rank's rows are the CPU loader's for the same
    # resume, and the two runs together deliver every sample (14 left: 5 per rank, the
    # last position repeated once as the padding rule says).
    if decoder == "gpu" and not _shardkit.NVJPEG_COMPILED:
        pytest.skip("this build of shardkit has no nvJPEG")
    address, samples = tar
    kw = dict(dtype="uint8", layout="NHWC", return_keys=True)
    before = []
    for r in range(2):
        ld = loader(address, device="cuda:0", decoder=decoder, rank=r, world_size=2, **kw)
        ld.set_epoch(3)
        it = iter(ld)
        before += next(it)[2]
        if r == 0:
            state = ld.state_dict()
        del it
    assert state["shardkit_loader"]["position"] == 10
    after = []
    for r in range(3):
        kw3 = dict(kw, rank=r, world_size=3, batch_size=2)
        dev = loader(address, device="cuda:0", decoder=decoder, **kw3)
        host = loader(address, **kw3)
        dev.load_state_dict(state)
        host.load_state_dict(state)
        assert dev.decoder == decoder and dev.batches_left == host.batches_left == 3
        rows = [k for _, _, keys in dev for k in keys]
        assert rows == [k for _, _, keys in host for k in keys]
        after += rows
    assert len(before) == 10 and len(after) == 15
    assert len(set(after[:-1])) == 14 and after[-1] in after[:-1]
    assert set(before).isdisjoint(after) and sorted(set(before + after)) == sorted(samples)
