"""Conversions split into parts from Python (issue 15): part=..., merge(), resume."""
import os

import pytest

import shardkit

from conftest import make_image_folder


def tree(d):
    """Every file except the parts' records -> bytes."""
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if ".part-" not in n}


@pytest.mark.parametrize("kind", ["convert", "shard"])
def test_parts_then_merge_equal_one_process(tmp_path, kind):
    make_image_folder(str(tmp_path / "images"))
    src = str(tmp_path / "images")
    kw = dict(shuffle=True, seed=4, shard_size="8KB") if kind == "convert" else dict(num_shards=5, shuffle=True)
    run = getattr(shardkit, kind)
    run(src, "wds:" + str(tmp_path / "one/t-%04d.tar"), **kw)
    dst = "wds:" + str(tmp_path / "parts/t-%04d.tar")
    for i, part in enumerate(["0/3", (1, 3), "2/3"]):
        s = run(src, dst, part=part, **kw)
        assert (s["part"], s["parts"]) == (i, 3)
        assert not os.path.exists(tmp_path / "parts/t.manifest.json")
    m = shardkit.merge(dst)
    assert m["parts"] == 3 and m["samples"] == 24 and not m["unchanged"]
    assert tree(tmp_path / "one") == tree(tmp_path / "parts")
    assert shardkit.merge(dst)["unchanged"]


def test_merge_names_the_missing_part_and_resume_skips_a_finished_one(tmp_path):
    make_image_folder(str(tmp_path / "images"))
    src = str(tmp_path / "images")
    dst = "wds:" + str(tmp_path / "o/t-%04d.tar")
    shardkit.convert(src, dst, samples_per_shard=5, part="0/2")
    with pytest.raises(shardkit.Error, match="part 1/2"):
        shardkit.merge(dst)
    again = shardkit.convert(src, dst, samples_per_shard=5, part="0/2", resume=True)
    assert again["already_complete"]
    with pytest.raises(shardkit.Error, match="0 <= I < N"):
        shardkit.convert(src, dst, part="2/2")
