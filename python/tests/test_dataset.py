"""shardkit.open / info / convert / shard and shardkit.Error, against real files."""
import os
import threading

import pytest

import shardkit


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_open_len_getitem_bytes_equal_files(data):
    address, samples = data[:2]
    ds = shardkit.open(address)
    assert len(ds) == len(samples) == 24
    keys = []
    for i in range(len(ds)):
        s = ds[i]
        keys.append(s["__key__"])
        path, label, _ = samples[s["__key__"]]
        assert s["jpg"] == read(path)
        assert s["cls"].strip() == str(label).encode()
        assert set(s) == {"__key__", "jpg", "cls"}
    assert sorted(keys) == sorted(samples)
    assert ds[-1] == ds[len(ds) - 1]
    assert [s["__key__"] for s in ds[2:8:3]] == [keys[2], keys[5]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]


def test_iteration_equals_random_access(data):
    address, _ = data[:2]
    ds = shardkit.open(address)
    assert list(ds) == [ds[i] for i in range(len(ds))]
    # Two iterators are independent.
    a, b = iter(ds), iter(ds)
    assert next(a) == next(b)


def test_info(folder):
    address, samples = folder
    ds = shardkit.open(address)
    info = ds.info
    assert info["format"] == "folder"
    assert info["num_samples"] == 24
    assert info["class_names"] == ["cat", "dog", "eel"]
    assert "jpg" in info["fields"] and "cls" in info["fields"]
    assert shardkit.info(address) == info
    assert ds.class_names == ["cat", "dog", "eel"]
    assert "folder" in repr(ds)


def test_missing_dataset_raises_error_with_file(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(shardkit.Error) as ei:
        shardkit.open(missing)
    e = ei.value
    assert isinstance(e, RuntimeError)
    assert e.code in ("not_found", "io_error", "invalid_argument")
    assert e.key is None and e.offset is None
    assert e.file is not None and "nope" in e.file
    assert "nope" in str(e)
    with pytest.raises(shardkit.Error):
        shardkit.info(missing)


def test_unreadable_sample_raises_with_key_and_file(folder):
    address, samples = folder
    ds = shardkit.open(address)
    path, _, _ = samples["dog/img3"]
    index = [ds[i]["__key__"] for i in range(len(ds))].index("dog/img3")
    os.remove(path)  # vanished after the dataset was indexed
    with pytest.raises(shardkit.Error) as ei:
        ds[index]
    assert ei.value.key == "dog/img3"
    assert ei.value.file is not None and ei.value.file.endswith("dog/img3.jpg")


def test_getitem_from_threads(data):
    # Many threads at once, from the very first access (which builds the random access
    # object while other threads wait for it: none may wait holding the GIL).
    address, samples = data[:2]
    expected = None
    for _ in range(5):
        ds = shardkit.open(address)
        barrier = threading.Barrier(6)
        results = {}

        def work(t):
            barrier.wait()
            results[t] = [ds[i]["jpg"] for i in range(len(ds))]

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "threads hung"
        expected = expected or [read(samples[ds[i]["__key__"]][0]) for i in range(len(ds))]
        assert all(results[t] == expected for t in range(6))


needs_convert = pytest.mark.skipif(not shardkit.HAVE_CONVERT, reason="no convert pipeline in this build")


@needs_convert
@pytest.mark.parametrize("dst_kind", ["wds", "lmdb"])
def test_convert_round_trip(tmp_path, data, dst_kind):
    address, samples = data[:2]
    seen = []
    if dst_kind == "wds":
        dst = "wds:" + str(tmp_path / "s-%06d.tar")
        back = "wds:" + str(tmp_path / "s-{000000..000002}.tar")
        summary = shardkit.convert(address, dst, samples_per_shard=10, progress=seen.append)
        assert [s["samples"] for s in summary["shards"]] == [10, 10, 4]
        assert all(os.path.exists(s["path"]) for s in summary["shards"])
    else:
        dst = back = "lmdb:" + str(tmp_path / "lm")
        summary = shardkit.convert(address, dst, threads=2, progress=seen.append)
    assert summary["samples"] == 24
    assert summary["destination_format"] == dst_kind
    assert seen and seen[-1]["samples"] == 24
    out = shardkit.open(back)
    src = shardkit.open(address)
    assert len(out) == 24
    assert [out[i]["__key__"] for i in range(24)] == [src[i]["__key__"] for i in range(24)]
    for i in range(24):
        assert out[i]["jpg"] == src[i]["jpg"] == read(samples[src[i]["__key__"]][0])


@needs_convert
def test_convert_refuses_existing_output(tmp_path, data):
    address = data[0]
    dst = "lmdb:" + str(tmp_path / "copy")
    shardkit.convert(address, dst)
    with pytest.raises(shardkit.Error) as ei:
        shardkit.convert(address, dst)
    assert ei.value.code == "already_exists"
    assert ei.value.file is not None and "copy" in ei.value.file
    # The library says what is wrong; Python names its own argument, not a CLI flag.
    assert "overwrite=True" in str(ei.value) and "--overwrite" not in str(ei.value)
    shardkit.convert(address, dst, overwrite=True)
    assert len(shardkit.open(dst)) == 24


@needs_convert
def test_convert_and_shard_default_to_the_cli_threads(tmp_path, folder):
    # `shardkit convert` and `shardkit shard` read with the cores, 2 to 8 (tools/cmd_convert.cc);
    # so do convert() and shard() unless told, and they say what they used.
    address = folder[0]
    cli_default = min(max(os.cpu_count() or 1, 2), 8)
    summary = shardkit.convert(address, "lmdb:" + str(tmp_path / "a"))
    assert summary["threads"] == cli_default > 1
    assert summary["samples"] == 24
    assert shardkit.convert(address, "lmdb:" + str(tmp_path / "b"), threads=1)["threads"] == 1
    assert shardkit.convert(address, "lmdb:" + str(tmp_path / "c"), threads=3)["threads"] == 3
    summary = shardkit.shard(address, str(tmp_path / "s-%06d.tar"), num_shards=2)
    assert summary["threads"] == cli_default
    assert [s["samples"] for s in summary["shards"]] == [12, 12]
    # The same bytes whatever the thread count.
    a, b = shardkit.open("lmdb:" + str(tmp_path / "a")), shardkit.open("lmdb:" + str(tmp_path / "b"))
    assert [a[i]["jpg"] for i in range(24)] == [b[i]["jpg"] for i in range(24)]


@needs_convert
def test_shard_even_counts_and_shuffle(tmp_path, data):
    address, samples = data[:2]
    summary = shardkit.shard(address, str(tmp_path / "t-%06d.tar"), num_shards=5, shuffle=True, seed=3)
    assert [s["samples"] for s in summary["shards"]] == [5, 5, 5, 5, 4]
    out = shardkit.open("wds:" + str(tmp_path / "t-{000000..000004}.tar"))
    keys = [s["__key__"] for s in out]
    assert sorted(keys) == sorted(samples)
    assert keys != sorted(keys)  # shuffled
    for s in out:
        assert s["jpg"] == read(samples[s["__key__"]][0])


def test_tar_shards_info(tmp_path):
    from conftest import make_image_folder, make_tar_shards

    samples = make_image_folder(str(tmp_path / "imgs"))
    address = make_tar_shards(str(tmp_path / "tar"), samples)
    info = shardkit.info(address)
    assert info["format"] == "wds"
    assert info["num_samples"] in (24, None)
    assert len(shardkit.open(address)) == 24
    assert [os.path.basename(s["path"]) for s in info["shards"]] == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert shardkit.detect_format(address) == "wds"


def test_truncated_shard_raises_with_file_and_offset(tmp_path):
    from conftest import make_image_folder, make_tar_shards

    samples = make_image_folder(str(tmp_path / "imgs"))
    address = make_tar_shards(str(tmp_path / "tar"), samples)
    path = str(tmp_path / "tar" / "train-000001.tar")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2 + 100)
    with pytest.raises(shardkit.Error) as ei:
        for _ in shardkit.open(address):
            pass
    e = ei.value
    assert e.code == "corrupt", str(e)
    assert e.file is not None and e.file.endswith("train-000001.tar"), str(e)
    assert e.offset is not None and 0 <= e.offset <= size


@needs_convert
def test_convert_progress_exception_is_raised_after(tmp_path, data):
    address = data[0]

    def boom(p):
        raise KeyError("stop")

    with pytest.raises(KeyError):
        shardkit.convert(address, "lmdb:" + str(tmp_path / "c"), progress=boom)


needs_verify = pytest.mark.skipif(not shardkit.HAVE_VERIFY, reason="no verify API in this build")


@pytest.mark.skipif(shardkit.HAVE_VERIFY, reason="this build has verify")
def test_verify_is_marked_missing():
    with pytest.raises(NotImplementedError):
        shardkit.verify("anything")


@needs_verify
@needs_convert
def test_verify_intact_then_damaged(tmp_path, data):
    address, samples = data[:2]
    shardkit.convert(address, "wds:" + str(tmp_path / "v-%06d.tar"), samples_per_shard=10)
    shards = "wds:" + str(tmp_path / "v-{000000..000002}.tar")
    seen = []
    report = shardkit.verify(shards, progress=seen.append)
    assert report["ok"] is True, report["findings"]
    assert report["samples"] == 24 and report["findings"] == [] and report["total_findings"] == 0
    assert seen and seen[-1]["samples"] == 24
    assert shardkit.verify(shards, against=address)["ok"] is True
    # Cut the middle shard: damage is a finding naming the file, not an exception.
    path = str(tmp_path / "v-000001.tar")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    report = shardkit.verify(shards)
    assert report["ok"] is False
    assert report["total_findings"] >= 1
    assert any(f["file"] and f["file"].endswith("v-000001.tar") for f in report["findings"]), report["findings"]
    assert sum(report["counts"].values()) == report["total_findings"]


@needs_verify
def test_verify_missing_dataset_raises(tmp_path):
    with pytest.raises(shardkit.Error) as ei:
        shardkit.verify(str(tmp_path / "nothing-here"))
    assert "nothing-here" in str(ei.value)


@needs_verify
@needs_convert
def test_manifest_outside_its_directory_is_refused_unless_trusted(tmp_path, data):
    """Confinement (docs/reliability.md): a manifest naming '../shared/...' is refused by
    open, verify, convert and Loader with an error naming the manifest and the entry;
    trust_manifest=True reads it as written."""
    address, samples = data[:2]
    shardkit.convert(address, "wds:" + str(tmp_path / "shared" / "s-%06d.tar"), samples_per_shard=10)
    import json
    with open(tmp_path / "shared" / "s.manifest.json") as f:
        m = json.load(f)
    for s in m["shards"]:
        s["path"] = "../shared/" + s["path"]
    (tmp_path / "view").mkdir()
    view = str(tmp_path / "view" / "s.manifest.json")
    with open(view, "w") as f:
        json.dump(m, f)
    for call in (lambda **kw: shardkit.open(view, **kw), lambda **kw: shardkit.verify(view, **kw),
                 lambda **kw: shardkit.convert(view, "wds:" + str(tmp_path / "o" / "x-%06d.tar"), **kw)):
        with pytest.raises(shardkit.Error) as ei:
            call()
        assert ei.value.code == "invalid_argument"
        assert ei.value.file == view
        assert "'../shared/s-000000.tar' is refused" in str(ei.value)
        assert "trust_manifest" in str(ei.value)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    assert len(shardkit.open(view, trust_manifest=True)) == 24
    assert shardkit.verify(view, trust_manifest=True)["ok"] is True
    shardkit.convert(view, "wds:" + str(tmp_path / "o2" / "x-%06d.tar"), trust_manifest=True)
    assert len(shardkit.open(str(tmp_path / "o2" / "x.manifest.json"))) == 24
    if shardkit.HAVE_LOADER:
        try:
            import torch  # noqa: F401  (the Loader needs torch)
        except ImportError:
            return
        with pytest.raises(shardkit.Error):
            shardkit.Loader(view, batch_size=4, output_size=16, threads=2)
        ld = shardkit.Loader(view, batch_size=4, output_size=16, threads=2, trust_manifest=True)
        assert sum(int(b[0].shape[0]) for b in ld) == 24
