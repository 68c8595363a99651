#!/usr/bin/env python3
"""How close two resized conversions of one image folder are to Pillow's resize of the
source (Image.BILINEAR, the same widening triangle filter, from the full decode):

    scripts/transform_quality.py SOURCE_DIR OUT_A OUT_B

OUT_A and OUT_B: tar shards written by `shardkit convert SOURCE_DIR wds:OUT/t-%06d.tar
--resize ...` (for example by two builds, or with and without a route). Prints the mean
absolute error per channel (of 255) of each against the reference, over the samples whose
images differ between A and B. Needs python3-pil and python3-numpy. Not a test.
"""
import glob
import io
import os
import sys
import tarfile

import numpy as np
from PIL import Image, ImageOps


def load(d):
    out = {}
    for t in sorted(glob.glob(os.path.join(d, "*.tar"))):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".jpg"):
                    out[m.name[:-4]] = tf.extractfile(m).read()
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, da, db = sys.argv[1:]
    a, b = load(da), load(db)
    if sorted(a) != sorted(b):
        sys.exit("the two outputs hold different keys")
    ea, eb, same = [], [], 0
    for k in sorted(a):
        if a[k] == b[k]:
            same += 1
            continue
        pa = np.asarray(Image.open(io.BytesIO(a[k])).convert("RGB"), dtype=np.int16)
        pb = np.asarray(Image.open(io.BytesIO(b[k])).convert("RGB"), dtype=np.int16)
        path = glob.glob(os.path.join(src, glob.escape(k)) + ".*")[0]
        im = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
        ref = np.asarray(im.resize((pa.shape[1], pa.shape[0]), Image.BILINEAR), dtype=np.int16)
        ea.append(np.abs(pa - ref).mean())
        eb.append(np.abs(pb - ref).mean())
    ea, eb = np.array(ea), np.array(eb)
    print("%d samples, %d identical in both, %d compared" % (len(a), same, len(ea)))
    if len(ea):
        print("mean absolute error against Pillow's resize: A %.3f, B %.3f; 95th percentile A %.3f, B %.3f; "
              "largest A - B %.3f" % (ea.mean(), eb.mean(), np.percentile(ea, 95), np.percentile(eb, 95),
                                      (ea - eb).max()))


if __name__ == "__main__":
    main()
