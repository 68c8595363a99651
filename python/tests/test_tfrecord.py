"""TFRecord against an independent client: TFRecord framing and tf.train.Example written
and read here from the specs alone (TensorFlow's "TFRecords format details" and
example.proto/feature.proto), with Python's protobuf and a CRC32C written in this file;
no shardkit code. Records it writes are read by shardkit, records shardkit writes are
read by it, and features survive a round trip through tar shards."""
import gzip
import io
import os
import struct
import tarfile
import zlib

import pytest

import shardkit

from conftest import make_image_folder

pytest.importorskip("google.protobuf")
from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402

try:
    from google.protobuf import message_factory as _mf
except ImportError:  # pragma: no cover
    _mf = None


# --- the spec client -------------------------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked(head)) + data + struct.pack("<I", masked(data))


def unframe(blob):
    """Every record's data; asserts both CRCs."""
    out, pos = [], 0
    while pos < len(blob):
        head = blob[pos:pos + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        assert hcrc == masked(head), f"length CRC at {pos}"
        data = blob[pos + 12:pos + 12 + n]
        (dcrc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
        assert dcrc == masked(data), f"data CRC at {pos}"
        out.append(data)
        pos += 16 + n
    assert pos == len(blob)
    return out


def _example_classes():
    """tf.train.Example's messages, declared here with TensorFlow's field numbers."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="spec_client/example.proto", package="specclient",
                                             syntax="proto3")
    for name, typ in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64)):
        m = fdp.message_type.add(name=name)
        m.field.add(name="value", number=1, type=typ, label=F.LABEL_REPEATED)
    feat = fdp.message_type.add(name="Feature")
    feat.oneof_decl.add(name="kind")
    for name, num, typ in (("bytes_list", 1, "BytesList"), ("float_list", 2, "FloatList"),
                           ("int64_list", 3, "Int64List")):
        feat.field.add(name=name, number=num, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                       type_name=".specclient." + typ, oneof_index=0)
    feats = fdp.message_type.add(name="Features")
    entry = feats.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".specclient.Feature")
    feats.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".specclient.Features.FeatureEntry")
    ex = fdp.message_type.add(name="Example")
    ex.field.add(name="features", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                 type_name=".specclient.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("specclient.Example")
    if hasattr(_mf, "GetMessageClass"):
        return _mf.GetMessageClass(desc)
    return _mf.MessageFactory(pool).GetPrototype(desc)


Example = _example_classes()


def make_example(features):
    """features: {name: bytes | [bytes] | int | [int] | float | [float]}."""
    ex = Example()
    for k, v in features.items():
        vals = v if isinstance(v, list) else [v]
        f = ex.features.feature[k]
        if isinstance(vals[0], bytes):
            f.bytes_list.value.extend(vals)
        elif isinstance(vals[0], int):
            f.int64_list.value.extend(vals)
        else:
            f.float_list.value.extend(vals)
    return ex.SerializeToString()


def parse_example(data):
    ex = Example()
    ex.ParseFromString(data)
    out = {}
    for k, f in ex.features.feature.items():
        kind = f.WhichOneof("kind")
        out[k] = (kind, list(getattr(f, kind).value)) if kind else (None, [])
    return out


# --- fixtures --------------------------------------------------------------------------

def jpeg(i):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (24 + i, 20), (10 * i, 100, 200 - 10 * i)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def imagenet_records(n=6):
    recs = []
    for i in range(n):
        recs.append({
            "image/encoded": jpeg(i),
            "image/class/label": 1 + i % 3,  # 1-based, as TensorFlow's ImageNet scripts write
            "image/filename": f"n0144076{i % 3}_{i}.JPEG".encode(),
            "image/format": b"JPEG",
            "image/height": 20,
            "image/width": 24 + i,
            "image/class/synset": f"n0144076{i % 3}".encode(),
            "image/object/bbox/xmin": [0.125, 0.5],
        })
    return recs


# --- tests -----------------------------------------------------------------------------

def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("compression", [None, "gzip", "zlib"])
def test_shardkit_reads_what_the_spec_client_writes(tmp_path, compression):
    recs = imagenet_records()
    blob = b"".join(frame(make_example(r)) for r in recs)
    if compression == "gzip":
        blob = gzip.compress(blob)
    elif compression == "zlib":
        blob = zlib.compress(blob)
    path = str(tmp_path / "train-00000-of-00001")
    with open(path, "wb") as f:
        f.write(blob)
    ds = shardkit.open(path)
    assert ds.info["format"] == "tfrecord"
    assert len(ds) == len(recs)
    for i, r in enumerate(recs):
        s = ds[i]
        assert s["__key__"] == f"n0144076{i % 3}_{i}"
        assert s["jpeg"] == r["image/encoded"]
        assert int(s["cls"]) == r["image/class/label"] - 1
        carried = parse_example(s["tfexample.pb"])
        assert carried["image/class/synset"] == ("bytes_list", [r["image/class/synset"]])
        assert carried["image/width"] == ("int64_list", [24 + i])
        assert carried["image/object/bbox/xmin"] == ("float_list", [0.125, 0.5])


def test_spec_client_reads_what_shardkit_writes(tmp_path):
    samples = make_image_folder(str(tmp_path / "imgs"))
    out = str(tmp_path / "out")
    shardkit.convert("folder:" + str(tmp_path / "imgs"), "tfrecord:" + out + "/t-%05d.tfrecord",
                     samples_per_shard=10)
    files = sorted(f for f in os.listdir(out) if f.endswith(".tfrecord"))
    assert files == ["t-00000.tfrecord", "t-00001.tfrecord", "t-00002.tfrecord"]
    seen = {}
    for name in files:
        with open(os.path.join(out, name), "rb") as f:
            for data in unframe(f.read()):
                feats = parse_example(data)
                fname = feats["image/filename"][1][0].decode()
                key = fname.rsplit(".", 1)[0]
                seen[key] = feats
        # DALI's tfrecord2idx index: "offset size" per record.
        idx = open(os.path.join(out, name[:-len(".tfrecord")] + ".idx")).read().split("\n")
        assert idx[0].startswith("0 ")
    assert sorted(seen) == sorted(samples)
    for key, (path, label, _) in samples.items():
        feats = seen[key]
        assert feats["image/encoded"] == ("bytes_list", [open(path, "rb").read()])
        assert feats["image/class/label"] == ("int64_list", [label + 1])
        assert feats["image/format"] == ("bytes_list", [b"JPEG"])


def test_gzip_written_by_shardkit_is_plain_gzip(tmp_path):
    samples = make_image_folder(str(tmp_path / "imgs"), per_class=2)
    path = str(tmp_path / "t.tfrecord")
    shardkit.convert("folder:" + str(tmp_path / "imgs"), "tfrecord:" + path, tfrecord_compression="gzip",
                     tfrecord_preset="tfds")
    with open(path, "rb") as f:
        recs = [parse_example(d) for d in unframe(gzip.decompress(f.read()))]
    assert len(recs) == len(samples)
    labels = sorted(r["label"][1][0] for r in recs)
    assert labels == sorted(label for _, label, _ in samples.values())
    assert all(r["file_name"][0] == "bytes_list" and r["image"][0] == "bytes_list" for r in recs)


def test_round_trip_through_tar_keeps_every_feature(tmp_path):
    recs = imagenet_records(4)
    src = str(tmp_path / "src.tfrecord")
    with open(src, "wb") as f:
        f.write(b"".join(frame(make_example(r)) for r in recs))
    shardkit.convert(src, "wds:" + str(tmp_path / "wds/x-%06d.tar"))
    with tarfile.open(str(tmp_path / "wds/x-000000.tar")) as tf:
        names = tf.getnames()
        assert "n01440760_0.jpeg" in names and "n01440760_0.cls" in names
        assert tf.extractfile("n01440760_0.jpeg").read() == recs[0]["image/encoded"]
        assert tf.extractfile("n01440760_0.cls").read() == b"0"
    shardkit.convert(str(tmp_path / "wds/x-000000.tar"), "tfrecord:" + str(tmp_path / "back.tfrecord"))
    with open(str(tmp_path / "back.tfrecord"), "rb") as f:
        back = [parse_example(d) for d in unframe(f.read())]
    want = [parse_example(make_example(r)) for r in recs]
    for b, w in zip(back, want):
        # Tar shards keep extensions in lower case: the file name comes back as ".jpeg".
        assert b.pop("image/filename") == ("bytes_list", [w.pop("image/filename")[1][0][:-4] + b"jpeg"])
    assert back == want


def test_field_map_reads_any_layout(tmp_path):
    path = str(tmp_path / "odd.tfrecord")
    with open(path, "wb") as f:
        for i in range(3):
            f.write(frame(make_example({"pixels": jpeg(i), "y": i + 1, "id": f"k{i}".encode()})))
    ds = shardkit.open(path, field_map={"pixels": "jpg", "y": "cls-1", "id": "__key__"})
    assert [s["__key__"] for s in ds] == ["k0", "k1", "k2"]
    assert [int(s["cls"]) for s in ds] == [0, 1, 2]
    assert ds[1]["jpg"] == jpeg(1)


def test_corrupt_record_names_file_and_offset(tmp_path):
    recs = [frame(make_example(r)) for r in imagenet_records(3)]
    bad = bytearray(recs[1])
    bad[len(bad) // 2] ^= 1
    path = str(tmp_path / "bad.tfrecord")
    with open(path, "wb") as f:
        f.write(recs[0] + bytes(bad) + recs[2])
    ds = shardkit.open(path)
    ds[0]
    with pytest.raises(shardkit.Error) as ei:
        ds[1]
    assert "bad.tfrecord" in str(ei.value)
    assert str(len(recs[0])) in str(ei.value)
    assert "CRC" in str(ei.value)
