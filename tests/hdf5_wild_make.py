# Makes HDF5 files of decoded images as h5py and Keras users write them (read by
# tests/hdf5_wild_test.cc), and expected.json: per file, each element's label
# and the md5 and shape of its pixels in [H, W, C] order.
import hashlib, json, sys
import h5py
import numpy as np

out = sys.argv[1]
n = 10
rng = np.random.default_rng(5)
imgs = rng.integers(0, 256, (n, 6, 7, 3), dtype=np.uint8)
labels = rng.integers(0, 10, n)
exp = {}
def record(name, hwc, labs):
    exp[name] = [{"md5": hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest(), "shape": list(a.shape),
                  "label": int(l)} for a, l in zip(hwc, labs)]

with h5py.File(f"{out}/contiguous.h5", "w") as f:
    f.create_dataset("images", data=imgs)
    f.create_dataset("labels", data=labels)
record("contiguous", imgs, labels)
with h5py.File(f"{out}/chunked.h5", "w") as f:
    f.create_dataset("images", data=imgs, chunks=(1, 6, 7, 3), compression="gzip")
    f.create_dataset("labels", data=labels.astype(np.int32), chunks=(4,))
record("chunked", imgs, labels)
with h5py.File(f"{out}/nchw.h5", "w") as f:
    f.create_dataset("images", data=imgs.transpose(0, 3, 1, 2))
    f.create_dataset("labels", data=labels)
record("nchw", imgs, labels)
with h5py.File(f"{out}/keras.h5", "w") as f:  # keras.datasets style arrays saved with h5py
    f.create_dataset("x_train", data=imgs)
    f.create_dataset("y_train", data=labels.astype(np.uint8).reshape(n, 1))
record("keras", imgs, labels)
# Read from the file's mapping (no filters, native type): chunks of 3 images (the
# last one partly used) behind a 512-byte user block; contiguous behind one too.
with h5py.File(f"{out}/chunked_raw.h5", "w", userblock_size=512) as f:
    f.create_dataset("images", data=imgs, chunks=(3, 6, 7, 3))
    f.create_dataset("labels", data=labels)
record("chunked_raw", imgs, labels)
with h5py.File(f"{out}/userblock.h5", "w", userblock_size=1024) as f:
    f.create_dataset("images", data=imgs)
    f.create_dataset("labels", data=labels)
record("userblock", imgs, labels)
# Chunks never written (fill values: zeros) beside written ones.
sparse = imgs.copy()
sparse[2:5] = 0
with h5py.File(f"{out}/sparse.h5", "w") as f:
    d = f.create_dataset("images", (n, 6, 7, 3), np.uint8, chunks=(1, 6, 7, 3))
    for i in list(range(0, 2)) + list(range(5, n)):
        d[i] = imgs[i]
    f.create_dataset("labels", data=labels)
record("sparse", sparse, labels)
# Stored big-endian: converted by HDF5, not read from the mapping.
fl = imgs.astype(np.float32) / 255
with h5py.File(f"{out}/float_be.h5", "w") as f:
    f.create_dataset("images", data=fl.astype(">f4"))
    f.create_dataset("labels", data=labels)
record("float_be", fl.astype("<f4"), labels)
gray = imgs[:, :, :, 0]
with h5py.File(f"{out}/gray.h5", "w") as f:
    f.create_dataset("images", data=gray)
    f.create_dataset("targets", data=labels)
record("gray", gray, labels)
with open(f"{out}/expected.json", "w") as f:
    json.dump(exp, f)
