#!/usr/bin/python3
"""The usual Python way to pack an image folder into LMDB, as a benchmark peer.

    /usr/bin/python3 scripts/peer_lmdb.py IMAGE_DIR OUT_LMDB

Walks IMAGE_DIR (one subfolder per class, sorted), reads each image file and
puts one record per image with py-lmdb (key: the relative path, value: the
file's bytes), committing every 1000 puts, as in common ImageNet scripts.
"""
import os
import sys

import lmdb


def main():
    src, out = sys.argv[1], sys.argv[2]
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    env = lmdb.open(out, map_size=1 << 40)
    txn = env.begin(write=True)
    n = 0
    for c in classes:
        for name in sorted(os.listdir(os.path.join(src, c))):
            with open(os.path.join(src, c, name), "rb") as f:
                txn.put(f"{c}/{name}".encode(), f.read())
            n += 1
            if n % 1000 == 0:
                txn.commit()
                txn = env.begin(write=True)
    txn.commit()
    env.sync()
    env.close()
    print(n)


if __name__ == "__main__":
    main()
