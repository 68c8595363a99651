# Makes LMDBs the way common scripts do (tests/lmdb_wild_test.cc reads them):
#  image_paths.lmdb  keys = relative paths, values = the image files' bytes
#  image_index.lmdb  keys = f"{idx}", values = image bytes
#  pickle_array.lmdb the GPU-utilisation article's recipe: keys f"{idx}",
#                    values pickle.dumps((cv2.imread(path), label)): BGR uint8 arrays
#  pickle_bytes.lmdb "folder to LMDB" scripts: pickle.dumps((jpeg bytes, label)) with
#                    __keys__ and __len__ beside the samples
#  pickle_gray.lmdb  pickle.dumps((2-D uint8 array, label)): grayscale, no channel order
#  pickle_mixed.lmdb a 2-D array, then an H x W x 3 one
#  split_crnn.lmdb   CRNN's image-%09d / label-%09d / num-samples
#  split_idx.lmdb    its kin: the image under f"{idx}", the label under f"label_{idx}",
#                    no count
#  split_under.lmdb  image_%d / label_%d with a pickled __len__
# and expected.json with what a reader must find (keys in dataset order, labels,
# and for arrays the pixels. md5).
import hashlib, io, json, os, pickle, sys
import lmdb
import numpy as np
from PIL import Image

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
proto = int(sys.argv[3]) if len(sys.argv) > 3 else pickle.DEFAULT_PROTOCOL
rng = np.random.default_rng(3)
classes = ["cat", "dog", "eel"]
exp = {}

def image(i, fmt):
    a = rng.integers(0, 256, (10 + i % 4, 12 + i % 3, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(a).save(b, format=fmt, quality=90) if fmt == "JPEG" else Image.fromarray(a).save(b, format=fmt)
    return a, b.getvalue()

def put_all(name, items):
    env = lmdb.open(f"{out}/{name}", map_size=1 << 30, subdir=True)
    with env.begin(write=True) as txn:
        for k, v in items:
            txn.put(k, v)
    env.close()

# 1. paths -> image bytes (label = parent folder)
items, e = [], []
for i in range(n):
    c = classes[i % 3]
    fmt, ext = ("PNG", "png") if i % 4 == 3 else ("JPEG", "JPEG" if i % 2 else "jpg")
    _, data = image(i, fmt)
    key = f"train/{c}/img_{i:03d}.{ext}"
    items.append((key.encode(), data))
    e.append({"key": f"train/{c}/img_{i:03d}", "ext": ext.lower(), "label": classes.index(c),
              "md5": hashlib.md5(data).hexdigest()})
put_all("image_paths.lmdb", items)
exp["image_paths"] = sorted(e, key=lambda x: x["key"] + "." + x["ext"])

# 2. indices -> image bytes
items, e = [], []
for i in range(n):
    _, data = image(i, "JPEG")
    items.append((f"{i}".encode(), data))
    e.append({"key": f"{i}", "ext": "jpg", "label": None, "md5": hashlib.md5(data).hexdigest()})
put_all("image_index.lmdb", items)
exp["image_index"] = e

# 3. the article's recipe: decoded BGR arrays
items, e = [], []
for i in range(n):
    rgb, data = image(i, "PNG")
    img = rgb[:, :, ::-1].copy()  # what cv2.imread returns: BGR
    label = i % 5
    items.append((f"{i}".encode(), pickle.dumps((img, label), protocol=proto)))
    e.append({"key": f"{i}", "ext": "npy", "label": label, "shape": list(img.shape),
              "md5": hashlib.md5(img.tobytes()).hexdigest(), "rgb_md5": hashlib.md5(rgb.tobytes()).hexdigest()})
put_all("pickle_array.lmdb", items)
exp["pickle_array"] = e

# 4. (jpeg bytes, label) + __keys__ / __len__
items, e, keys = [], [], []
for i in range(n):
    _, data = image(i, "JPEG")
    k = f"{i}".encode("ascii")
    keys.append(k)
    items.append((k, pickle.dumps((data, np.int64(i % 3)), protocol=proto)))
    e.append({"key": f"{i}", "ext": "jpg", "label": i % 3, "md5": hashlib.md5(data).hexdigest()})
items.append((b"__keys__", pickle.dumps(keys, protocol=proto)))
items.append((b"__len__", pickle.dumps(len(keys), protocol=proto)))
put_all("pickle_bytes.lmdb", items)
exp["pickle_bytes"] = e

# 5. grayscale arrays (2-D: no channel order), and a mixed LMDB whose first array is
#    2-D and whose second has 3 channels (their order is unknown)
items, e = [], []
for i in range(n):
    g = rng.integers(0, 256, (9 + i % 3, 11), dtype=np.uint8)
    items.append((f"{i}".encode(), pickle.dumps((g, i % 2), protocol=proto)))
    e.append({"key": f"{i}", "label": i % 2, "shape": list(g.shape), "md5": hashlib.md5(g.tobytes()).hexdigest()})
put_all("pickle_gray.lmdb", items)
exp["pickle_gray"] = e
items = [(b"0", pickle.dumps((rng.integers(0, 256, (8, 8), dtype=np.uint8), 0), protocol=proto)),
         (b"1", pickle.dumps((rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), 1), protocol=proto))]
put_all("pickle_mixed.lmdb", items)

# 6. CRNN's create_dataset.py (text recognition): image-%09d (1-based) -> image bytes,
#    label-%09d -> label text, num-samples -> the count as text
items, e = [], []
words = ["hello", "world", "crème", "42", "a b", "日本"]
for i in range(1, n + 1):
    _, data = image(i, "JPEG")
    w = words[i % len(words)] + str(i)
    items.append((b"image-%09d" % i, data))
    items.append((b"label-%09d" % i, w.encode("utf-8")))
    e.append({"key": "%09d" % i, "ext": "jpg", "txt": w,
              "md5": hashlib.md5(data).hexdigest()})
items.append((b"num-samples", str(n).encode()))
put_all("split_crnn.lmdb", items)
exp["split_crnn"] = e

# 7. Its kin: the image under the bare index, the label text under label_<idx>
#    (0-based, no padding, no count); and image_%d / label_%d with a pickled __len__.
for name, img_key, count in (("split_idx", "{}", None), ("split_under", "image_{}", b"__len__")):
    items, e = [], []
    for i in range(n):
        _, data = image(i, "PNG")
        w = words[i % len(words)] + "-" + str(i)
        items.append((img_key.format(i).encode(), data))
        items.append((b"label_%d" % i, w.encode("utf-8")))
        e.append({"key": str(i), "ext": "png", "txt": w, "md5": hashlib.md5(data).hexdigest()})
    if count:
        items.append((count, pickle.dumps(n, protocol=proto)))
    put_all(f"{name}.lmdb", items)
    exp[name] = e

with open(f"{out}/expected.json", "w") as f:
    json.dump(exp, f)
