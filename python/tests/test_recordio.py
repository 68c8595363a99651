"""MXNet RecordIO against an independent client written here from the spec with
Python's struct: dmlc-core's framing (include/dmlc/recordio.h: magic, cflag << 29 |
length, 4-byte padding, records split at aligned magic words) and mxnet's
pure-Python recordio.pack/unpack header layout (_IR_FORMAT 'IfQQ': flag, label, id,
id2; flag > 0 float32 labels follow). The client writes .rec/.idx that shardkit
reads, and reads what shardkit writes."""
import io
import json
import os
import struct
import tarfile

import pytest

import shardkit

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
IR_FORMAT = "<IfQQ"  # mxnet.recordio._IR_FORMAT ('IfQQ', native = little-endian here)
IR_SIZE = struct.calcsize(IR_FORMAT)


# ---- the client: mxnet's pack/unpack (recordio.py) and dmlc-core's framing

def pack(flag_label, idx, img):
    """mxnet.recordio.pack(IRHeader(0, label, idx, 0), img)."""
    if isinstance(flag_label, (int, float)):
        return struct.pack(IR_FORMAT, 0, float(flag_label), idx, 0) + img
    labels = list(flag_label)
    return struct.pack(IR_FORMAT, len(labels), 0.0, idx, 0) + struct.pack("<%df" % len(labels), *labels) + img


def unpack(s):
    flag, label, idx, idx2 = struct.unpack(IR_FORMAT, s[:IR_SIZE])
    s = s[IR_SIZE:]
    if flag > 0:
        label = list(struct.unpack("<%df" % flag, s[:4 * flag]))
        s = s[4 * flag:]
    return (flag, label, idx, idx2), s


def frame(payload):
    """dmlc::RecordIOWriter::WriteRecord."""
    out = b""
    dptr = 0
    lower = len(payload) // 4 * 4
    for i in range(0, lower, 4):
        if payload[i:i + 4] == MAGIC_BYTES:
            part = payload[dptr:i]
            out += MAGIC_BYTES + struct.pack("<I", ((1 if dptr == 0 else 2) << 29) | len(part)) + part
            dptr = i + 4
    part = payload[dptr:]
    out += MAGIC_BYTES + struct.pack("<I", ((3 if dptr != 0 else 0) << 29) | len(part)) + part
    return out + b"\0" * (-len(part) % 4)


def read_records(data):
    """dmlc::RecordIOReader::NextRecord over a whole file: [(offset, payload)]."""
    out, pos = [], 0
    while pos < len(data):
        start, rec = pos, b""
        while True:
            magic, lrec = struct.unpack("<II", data[pos:pos + 8])
            assert magic == MAGIC, f"bad magic at {pos}"
            cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
            rec += data[pos + 8:pos + 8 + length]
            pos += 8 + length + (-length % 4)
            if cflag in (0, 3):
                break
            rec += MAGIC_BYTES
        out.append((start, rec))
    return out


def write_rec(path, items):
    """items: [(idx, label or [labels], image bytes)] -> path (.rec) and its .idx."""
    data, idx = b"", ""
    for key, label, img in items:
        idx += f"{key}\t{len(data)}\n"
        data += frame(pack(label, key, img))
    with open(path, "wb") as f:
        f.write(data)
    with open(path[:-4] + ".idx", "w") as f:
        f.write(idx)
    return data


def magic_image(base):
    """A JPEG's bytes with the magic word placed at an aligned offset of the record's payload."""
    at = (IR_SIZE + 40) // 4 * 4 - IR_SIZE
    return base[:at] + MAGIC_BYTES + base[at:] + MAGIC_BYTES


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def client_rec(folder, tmp_path):
    """A .rec + .idx written by the client from the image folder: int labels, one float
    label, one multi-label record, and two continuation records (magic in the payload)."""
    _, samples = folder
    keys = sorted(samples)
    items = []
    for i, k in enumerate(keys):
        path, label, _ = samples[k]
        img = read(path)
        lab = label
        if i == 3:
            lab = 1.5
        if i == 5:
            lab = [1.0, 2.0, 0.25]
        if i in (7, 8):
            img = magic_image(img)
        items.append((i, lab, img))
    rec = str(tmp_path / "client" / "data.rec")
    os.makedirs(os.path.dirname(rec))
    data = write_rec(rec, items)
    assert data.count(MAGIC_BYTES) > len(items)  # continuation parts present
    return rec, items


def test_shardkit_reads_client_written_rec(client_rec):
    rec, items = client_rec
    assert shardkit.detect_format(rec) == "recordio"
    ds = shardkit.open(rec)
    assert len(ds) == len(items)
    for i, (key, label, img) in enumerate(items):
        s = ds[i]
        assert s["__key__"] == str(key)
        assert s["jpg"] == img
        if isinstance(label, int):
            assert s["cls"] == str(label).encode()
        elif isinstance(label, float):
            assert json.loads(s["labels.json"]) == label
            assert "cls" not in s
        else:
            assert json.loads(s["labels.json"]) == label
    assert list(ds) == [ds[i] for i in range(len(ds))]
    rep = shardkit.verify("recordio:" + rec)
    # Only the mixed label fields (cls, labels.json) on purpose; no structure finding.
    assert {f["kind"] for f in rep["findings"]} == {"missing-field"}, rep


def test_client_reads_shardkit_written_rec(folder, tmp_path):
    address, samples = folder
    out = str(tmp_path / "out" / "train.rec")
    shardkit.convert(address, "recordio:" + out)
    data = read(out)
    records = read_records(data)
    keys = sorted(samples)
    assert len(records) == len(keys)
    idx = [line.split("\t") for line in open(out[:-4] + ".idx").read().splitlines()]
    assert [int(o) for _, o in idx] == [off for off, _ in records]
    side = json.load(open(out[:-4] + ".shardkit.json"))
    assert side["keys"] == keys
    assert side["class_names"] == ["cat", "dog", "eel"]
    for i, (off, payload) in enumerate(records):
        (flag, label, rid, rid2), img = unpack(payload)
        path, want_label, _ = samples[keys[i]]
        assert flag == 0 and label == float(want_label) and rid == i and rid2 == 0
        assert img == read(path)
        assert int(idx[i][0]) == rid


def test_convert_client_rec_to_tar_and_back(client_rec, tmp_path):
    rec, items = client_rec
    tars = str(tmp_path / "tar" / "x-%06d.tar")
    shardkit.convert("recordio:" + rec, "wds:" + tars)
    # The tar shard read with Python's tarfile: same image bytes, labels as fields.
    with tarfile.open(tars % 0) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    for key, label, img in items:
        assert members[f"{key}.jpg"] == img
        if isinstance(label, int):
            assert members[f"{key}.cls"] == str(label).encode()
        else:
            assert json.loads(members[f"{key}.labels.json"]) == label
    # Back to RecordIO: the client reads the same payloads, continuation records included.
    back = str(tmp_path / "back" / "y.rec")
    shardkit.convert("wds:" + tars % 0, "recordio:" + back)
    got = read_records(read(back))
    assert len(got) == len(items)
    for (key, label, img), (_, payload) in zip(items, got):
        (flag, glabel, rid, _), gimg = unpack(payload)
        assert gimg == img and rid == key
        if isinstance(label, list):
            assert flag == len(label) and glabel == label
        else:
            assert flag == 0 and glabel == label


def test_hostile_rec_raises_error_naming_file_and_offset(tmp_path):
    good = frame(pack(1, 0, b"\xff\xd8\xffabc"))
    bad = good + MAGIC_BYTES + struct.pack("<I", (1 << 29) | 4) + b"abcd"  # a first part, then the end
    path = str(tmp_path / "bad.rec")
    with open(path, "wb") as f:
        f.write(bad)
    # Without an .idx: read in order (the error at the damage), no random access (the
    # error says how to make an index).
    ds = shardkit.open("recordio:" + path)
    with pytest.raises(shardkit.Error) as ei:
        for _ in ds:
            pass
    assert ei.value.code == "corrupt"
    assert ei.value.file == path and ei.value.offset == len(bad)
    with pytest.raises(shardkit.Error) as ei:
        ds[0]
    assert ei.value.code == "unsupported" and "shardkit index" in str(ei.value)
    with open(path[:-4] + ".idx", "w") as f:
        f.write(f"0\t0\n1\t{len(good)}\n")
    ds = shardkit.open("recordio:" + path)
    assert ds[0]["cls"] == b"1"
    with pytest.raises(shardkit.Error) as ei:
        ds[1]
    assert ei.value.code == "corrupt"
    assert ei.value.file == path and ei.value.offset == len(bad)
    assert path in str(ei.value)


def test_loader_reads_client_rec(client_rec):
    torch = pytest.importorskip("torch")
    if not shardkit.HAVE_LOADER:
        pytest.skip("no loader in this build")
    rec, items = client_rec
    # The magic-word records are no longer valid JPEGs: load the others.
    clean = [it for i, it in enumerate(items) if i not in (7, 8)]
    path = rec[:-4] + "-clean.rec"
    write_rec(path, clean)
    ld = shardkit.Loader("recordio:" + path, batch_size=4, output_size=16, threads=2, seed=1, return_keys=True)
    want = {str(k): (lab if isinstance(lab, int) else -1) for k, lab, _ in clean}
    seen = {}
    for images, labels, keys in ld:
        assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.float32
        seen.update(zip(keys, labels.tolist()))
    assert seen == want
