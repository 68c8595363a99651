"""Each format's writer options are convert()'s keyword arguments <format>_<name>, made
from the formats' own tables (shardkit.format_options())."""
import pytest

import shardkit
from conftest import make_image_folder


def test_every_table_option_is_a_keyword_argument(tmp_path):
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    table = shardkit.format_options()
    keys = {o["key"] for o in table}
    assert {"lmdb.layout", "mds.compression", "mds.hashes", "tfrecord.preset", "hdf5.arrays"} <= keys
    root = str(tmp_path / "imgs")
    make_image_folder(root)
    # Every option at its default, as a keyword argument: accepted (other formats' keys are
    # ignored by the folder writer).
    defaults = {o["format"] + "_" + o["name"]: o["default"] for o in table}
    shardkit.convert(root, "folder:" + str(tmp_path / "copy"), **defaults)
    # One reaches its writer: a Caffe LMDB says so.
    shardkit.convert(root, str(tmp_path / "c.lmdb"), lmdb_layout="caffe")
    assert shardkit.info(str(tmp_path / "c.lmdb"))["extra"]["layout"] == "caffe"
    # A value outside the table's choices, and a name no table has, are refused.
    with pytest.raises(shardkit.Error, match="lmdb.layout"):
        shardkit.convert(root, str(tmp_path / "d.lmdb"), lmdb_layout="nope")
    with pytest.raises(TypeError):
        shardkit.convert(root, str(tmp_path / "e.lmdb"), lmdb_nope="x")


def test_reader_options_come_from_the_tables_and_are_checked(tmp_path):
    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert in this build")
    read = shardkit.format_options(kind="read")
    keys = {o["key"] for o in read}
    assert {"wds.channels", "lmdb.layout", "hdf5.order", "folder.files", "wds.index_budget"} <= keys
    assert all(not o["write"] for o in read)
    assert not any(o["key"] == "wds.channels" for o in shardkit.format_options())  # writers' only
    root = str(tmp_path / "imgs")
    make_image_folder(root)
    assert len(shardkit.open(root, source_options={"folder.files": "all"})) > 0
    with pytest.raises(shardkit.Error, match="unknown option 'folder.nope' of the folder reader"):
        shardkit.open(root, source_options={"folder.nope": "1"})
    with pytest.raises(shardkit.Error, match="folder.channels"):
        shardkit.open(root, source_options={"folder.channels": "grb"})
