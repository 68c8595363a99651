"""Remote shards (docs/remote.md): shardkit.open / convert / Loader on http:// addresses
served by tests/remote_http_server.py, which the test starts on a free loopback port."""
import os
import subprocess
import sys
import time

import pytest

import shardkit

SERVER = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "remote_http_server.py")


@pytest.fixture
def http_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, SERVER, "--root", str(root), "--port-file", str(port_file)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            if proc.poll() is not None:
                pytest.fail("remote_http_server.py exited before listening")
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        try:
            shardkit.open(base + "/missing.tar")
        except shardkit.Error as e:
            if "unknown storage scheme" in str(e):  # built with -DSHARDKIT_WITH_REMOTE=OFF
                pytest.skip("this build of shardkit has no remote client")
        yield root, base
    finally:
        proc.kill()
        proc.wait()


def samples_of(ds, random=False):
    out = {}
    if random:
        for i in reversed(range(len(ds))):
            s = ds[i]
            out[s["__key__"]] = {k: bytes(v) for k, v in s.items() if k != "__key__"}
    else:
        for s in ds:
            out[s["__key__"]] = {k: bytes(v) for k, v in s.items() if k != "__key__"}
    return out


def test_open_convert_and_cache_over_http(folder, http_root, tmp_path):
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    address, _ = folder
    root, base = http_root
    shardkit.shard(address, str(root / "train-%06d.tar"), samples_per_shard=10)
    local = samples_of(shardkit.open(str(root / "train.manifest.json")))
    assert len(local) == 24
    remote = shardkit.open(base + "/train.manifest.json")
    assert remote.info["num_samples"] == 24
    assert samples_of(remote) == local
    assert samples_of(remote, random=True) == local
    cache = tmp_path / "cache"
    cached = shardkit.open(base + "/train-{000000..000002}.tar", cache_dir=str(cache))
    assert samples_of(cached, random=True) == local
    assert sorted(p.name.split("-", 2)[2] for p in cache.iterdir() if not p.name.endswith(".lock")
                  and not p.name.startswith(".")) == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    # Upload to an HTTP PUT target, manifest last, and read it back.
    os.environ["SHARDKIT_STAGING_DIR"] = str(tmp_path / "staging")
    shardkit.convert(base + "/train.manifest.json", base + "/copy/out-%06d.tar")
    assert (root / "copy" / "out.manifest.json").exists()
    assert samples_of(shardkit.open(base + "/copy/out.manifest.json")) == local


def test_every_format_reads_over_http(folder, http_root, tmp_path):
    """LMDB, HDF5, MDS, RecordIO and TFRecord at an http:// address read the same samples
    as their local files (each through a local copy made by the library); a missing one
    names its address."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    address, _ = folder
    root, base = http_root
    for out, read in (("x.lmdb", "x.lmdb"), ("x.h5", "x.h5"), ("mds:{}/mds", "mds:{}/mds"),
                      ("rec/train.rec", "rec/train.rec"), ("tf/train-%05d.tfrecord", "tf/train-00000.tfrecord")):
        local_out = out.format(root) if "{}" in out else str(root / out)
        shardkit.convert(address, local_out)
        local = samples_of(shardkit.open(read.format(root) if "{}" in read else str(root / read)))
        assert len(local) == 24
        remote = shardkit.open(read.format(base) if "{}" in read else base + "/" + read)
        assert samples_of(remote, random=True) == local, read
    with pytest.raises(shardkit.Error) as e:
        shardkit.open("lmdb:" + base + "/missing.lmdb")
    assert base + "/missing.lmdb" in str(e.value)


def test_loader_over_http_with_a_cache(folder, http_root, tmp_path):
    if not (shardkit.HAVE_CONVERT and shardkit.HAVE_LOADER):
        pytest.skip("no convert or loader in this build")
    pytest.importorskip("torch")
    address, _ = folder
    root, base = http_root
    shardkit.shard(address, str(root / "train-%06d.tar"), samples_per_shard=10)
    cache = tmp_path / "cache"
    try:
        for kw in ({}, {"cache_dir": str(cache)}):
            loader = shardkit.Loader(base + "/train.manifest.json", batch_size=4, output_size=32, threads=2,
                                     shuffle=True, **kw)
            n = 0
            for images, labels in loader:
                assert images.shape[1:] == (3, 32, 32)
                n += images.shape[0]
            assert n == 24
            loader.close()
        assert any(p.name.endswith("train-000000.tar") for p in cache.iterdir())
    finally:
        os.environ.pop("SHARDKIT_CACHE_DIR", None)
        os.environ.pop("SHARDKIT_CACHE_BYTES", None)


def test_cache_and_staging_are_arguments_with_the_environment_below_them(folder, http_root, tmp_path, monkeypatch):
    """Issue 13: the library reads no environment; the module turns SHARDKIT_CACHE_DIR and
    SHARDKIT_STAGING_DIR into options when the argument is not given."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    address, _ = folder
    root, base = http_root
    shardkit.shard(address, str(root / "train-%06d.tar"), samples_per_shard=10)
    manifest = base + "/train.manifest.json"
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "env-cache"))
    want = samples_of(shardkit.open(str(root / "train.manifest.json")))
    assert samples_of(shardkit.open(manifest, cache_dir=str(tmp_path / "arg-cache")), random=True) == want
    assert any((tmp_path / "arg-cache").iterdir())
    assert not (tmp_path / "env-cache").exists()
    assert samples_of(shardkit.open(manifest), random=True) == want
    assert any((tmp_path / "env-cache").iterdir())
    monkeypatch.setenv("SHARDKIT_CACHE_BYTES", "lots")
    with pytest.raises(shardkit.Error, match="SHARDKIT_CACHE_BYTES 'lots'"):
        shardkit.open(manifest)
    monkeypatch.delenv("SHARDKIT_CACHE_BYTES")
    monkeypatch.delenv("SHARDKIT_CACHE_DIR")
    # A remote output: staged below staging_dir= (its directory is made there, and only there).
    monkeypatch.setenv("SHARDKIT_STAGING_DIR", str(tmp_path / "env-staging"))
    shardkit.convert(manifest, base + "/a/out-%06d.tar", staging_dir=str(tmp_path / "arg-staging"))
    assert (root / "a" / "out.manifest.json").exists()
    assert (tmp_path / "arg-staging").is_dir() and not (tmp_path / "env-staging").exists()
    shardkit.shard(manifest, base + "/b/out-%06d.tar", samples_per_shard=10)
    assert (root / "b" / "out.manifest.json").exists()
    assert (tmp_path / "env-staging").is_dir()


def test_loader_cache_dir_is_its_own_option(folder, http_root, tmp_path, monkeypatch):
    if not (shardkit.HAVE_CONVERT and shardkit.HAVE_LOADER):
        pytest.skip("no convert or loader in this build")
    pytest.importorskip("torch")
    address, _ = folder
    root, base = http_root
    shardkit.shard(address, str(root / "train-%06d.tar"), samples_per_shard=10)
    monkeypatch.delenv("SHARDKIT_CACHE_DIR", raising=False)
    loader = shardkit.Loader(base + "/train.manifest.json", batch_size=4, output_size=32, threads=2,
                             cache_dir=str(tmp_path / "loader-cache"))
    assert "SHARDKIT_CACHE_DIR" not in os.environ  # no longer set for the whole process
    assert sum(images.shape[0] for images, _ in loader) == 24
    loader.close()
    assert any(p.name.endswith("train-000000.tar") for p in (tmp_path / "loader-cache").iterdir())


def test_a_password_in_an_address_is_not_shown(folder, http_root):
    """Issue 14: secrets never appear in an error, info or a repr. The test server takes any
    credentials; the address carries user:secret@ and the reads work."""
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    address, _ = folder
    root, base = http_root
    shardkit.shard(address, str(root / "train-%06d.tar"), samples_per_shard=10)
    secret_base = base.replace("http://", "http://user:s3cr3tpw@")
    ds = shardkit.open(secret_base + "/train.manifest.json")
    assert len(ds) == 24 and ds[0]["__key__"]
    info = ds.info
    assert info["num_samples"] == 24
    shown = repr(info) + repr(ds) + repr(shardkit.info(secret_base + "/train.manifest.json"))
    assert "s3cr3tpw" not in shown, shown
    assert "127.0.0.1" in shown  # the address is there, without its password
    assert ds.address == secret_base + "/train.manifest.json"  # as given, to pass on
    with pytest.raises(shardkit.Error) as e:
        shardkit.open(secret_base + "/no-such-shard.tar")[0]
    assert "s3cr3tpw" not in str(e.value) and "no-such-shard" in str(e.value), str(e.value)
