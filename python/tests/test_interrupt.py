"""Ctrl-C during shardkit.convert() stops the conversion before the next sample, as the
command's SIGINT does: nothing is published, KeyboardInterrupt is raised (or the
program's own SIGINT handler runs), and resume=True finishes the output.
The signal is raised for real inside the library at a chosen sample
(SHARDKIT_TEST_RAISE=SIGNUM@N, lib/pipeline/convert.cc)."""
import os
import signal

import pytest

import shardkit

pytestmark = pytest.mark.skipif(not shardkit.HAVE_CONVERT, reason="no convert in this build")


def _folder(tmp_path):
    from conftest import make_image_folder

    root = str(tmp_path / "imgs")
    return root, len(make_image_folder(root))


def test_ctrl_c_stops_convert_and_resume_finishes(tmp_path, monkeypatch):
    root, n = _folder(tmp_path)
    out = "wds:" + str(tmp_path / "o" / "t-%06d.tar")
    manifest = tmp_path / "o" / "t.manifest.json"
    monkeypatch.setenv("SHARDKIT_TEST_RAISE", str(int(signal.SIGINT)) + "@5")
    with pytest.raises(KeyboardInterrupt):
        shardkit.convert(root, out, samples_per_shard=2, threads=1)
    assert not manifest.exists()
    monkeypatch.delenv("SHARDKIT_TEST_RAISE")
    s = shardkit.convert(root, out, samples_per_shard=2, threads=1, resume=True)
    assert s["samples"] == n
    assert manifest.exists()
    # The stop request does not outlive the interrupted call.
    again = shardkit.convert(root, "wds:" + str(tmp_path / "p" / "t-%06d.tar"), threads=1)
    assert again["samples"] == n


def test_ctrl_c_runs_the_programs_own_handler(tmp_path, monkeypatch):
    root, _ = _folder(tmp_path)
    seen = []
    old = signal.signal(signal.SIGINT, lambda sig, frame: seen.append(sig))
    try:
        monkeypatch.setenv("SHARDKIT_TEST_RAISE", str(int(signal.SIGINT)) + "@3")
        with pytest.raises(shardkit.Error, match="interrupted by SIGINT after 3 of"):
            shardkit.convert(root, "wds:" + str(tmp_path / "o" / "t-%06d.tar"), threads=1)
    finally:
        signal.signal(signal.SIGINT, old)
    assert seen == [signal.SIGINT]
    assert not (tmp_path / "o" / "t.manifest.json").exists()
    assert signal.getsignal(signal.SIGINT) is old
