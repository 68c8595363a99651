# Makes the pickle fixtures of tests/pickle_test.cc with Debian's python3-numpy:
# for every protocol 2..5 and every dtype the reader accepts, NAME.pkl (a pickle)
# and NAME.npy (np.save of the same array: the expected bytes), plus plain-data
# pickles with their expected value as JSON, and the hostile set.
import json, os, pickle, sys
import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
cases = []
rng = np.random.default_rng(7)
dtypes = ["|u1", "|i1", "|b1", "<u2", ">u2", "<i2", "<u4", "<i4", ">i4", "<u8", "<i8", "<f2", "<f4", ">f4", "<f8", "<c8", "<c16"]
shapes = [(0,), (5,), (2, 3), (4, 5, 3), (2, 1, 3, 2)]
for proto in (2, 3, 4, 5):
    for dt in dtypes:
        for si, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if dt == "|b1":
                a = rng.integers(0, 2, n).astype(bool)
            elif dt[1] in "fc":
                a = (rng.standard_normal(n) * 100).astype(dt)
            else:
                a = rng.integers(0, 120, n).astype(dt)
            a = a.reshape(shape).astype(dt)
            for order in ("C", "F", "strided"):
                if order == "F":
                    if len(shape) < 2: continue
                    b = np.asfortranarray(a)
                elif order == "strided":
                    if si != 2: continue
                    b = np.concatenate([a, a], axis=1)[:, ::2]
                else:
                    b = a
                name = f"p{proto}_{dt[1:]}{'be' if dt[0] == '>' else ''}_{si}_{order}"
                with open(f"{out}/{name}.pkl", "wb") as f:
                    f.write(pickle.dumps(b, protocol=proto))
                # What pickle holds: the array's own order (C, or F when F-contiguous and not C).
                np.save(f"{out}/{name}.npy", b if (b.flags.c_contiguous or b.flags.f_contiguous) else np.ascontiguousarray(b))
                cases.append(name)
    # the article's recipe: (decoded BGR image, label); numpy scalars; plain data
    img = rng.integers(0, 256, (7, 9, 3), dtype=np.uint8)
    with open(f"{out}/p{proto}_tuple.pkl", "wb") as f:
        f.write(pickle.dumps((img, 3), protocol=proto))
    np.save(f"{out}/p{proto}_tuple.npy", img)
    with open(f"{out}/p{proto}_scalar.pkl", "wb") as f:
        f.write(pickle.dumps((np.int64(-5), np.float32(1.5), np.uint8(200)), protocol=proto))
    data = {"a": [1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63 - 1, -2**63], "s": "héllo ✓", "b": b"\x00\xffraw",
            "e": b"", "t": (None, True, False, 1.25, -0.0), "nested": [[1, [2, [3]]], {"k": "v"}], "shared": None}
    shared = [1, 2]
    data["shared"] = [shared, shared]
    with open(f"{out}/p{proto}_data.pkl", "wb") as f:
        f.write(pickle.dumps(data, protocol=proto))
with open(f"{out}/cases.json", "w") as f:
    json.dump(cases, f)

# The hostile set. None of these may execute anything or crash the reader.
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + out + "/PWNED",))
hostile = {}
hostile["os_system"] = pickle.dumps(Evil(), protocol=2)
hostile["os_system_p4"] = pickle.dumps(Evil(), protocol=4)
hostile["eval_in_tuple"] = pickle.dumps((np.zeros(3, np.uint8), Evil()), protocol=4)
# REDUCE of a callable that is not allowed: builtins.getattr on a allowed-looking tuple
hostile["builtins_getattr"] = b"\x80\x04\x8c\x08builtins\x8c\x07getattr\x93)R."
# REDUCE of an allowed global that is not a function we read (numpy.ndarray called directly)
hostile["reduce_ndarray"] = b"\x80\x04\x8c\x05numpy\x8c\x07ndarray\x93K\x03\x85R."
# REDUCE of a non-callable (a tuple)
hostile["reduce_tuple"] = b"\x80\x04)K\x01\x85R."
good = pickle.dumps((np.zeros((4, 4), np.uint8), 1), protocol=4)
hostile["truncated"] = good[: len(good) // 2]
hostile["truncated_frame"] = good[:12]
hostile["truncated_p2"] = pickle.dumps((np.zeros((4, 4), np.uint8), 1), protocol=2)[:-30]
hostile["memo_out_of_range"] = b"\x80\x04K\x01\x94h\x05."
hostile["memo_long_out_of_range"] = b"\x80\x04K\x01\x94j\xff\xff\xff\xff."
# declared shape (1000, 1000) with 6 bytes of data, both array spellings
hostile["shape_exceeds"] = pickle.dumps(np.arange(6, dtype=np.uint8), protocol=4).replace(b"K\x06\x85", b"M\xe8\x03M\xe8\x03\x86")
hostile["shape_exceeds_p5"] = pickle.dumps(np.arange(6, dtype=np.uint8).reshape(2, 3), protocol=5).replace(b"K\x02K\x03\x86", b"J\x00\x00\x00\x40K\x40\x86")
# recursion bombs: a list containing itself, deep nesting, and shared-reference blow-up
hostile["self_list"] = b"\x80\x04]\x94(h\x00e."
hostile["deep_nesting"] = b"\x80\x04" + b"]" * 1000 + b"a" * 999 + b"."
bomb = b"\x80\x04]\x94"  # l0 = []
for i in range(1, 60):  # li = [l(i-1), l(i-1)]
    bomb += b"0(h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"l\x94"
hostile["shared_bomb"] = bomb + b"."
hostile["marks_bomb"] = b"\x80\x04" + b"(" * 1000000 + b"."
hostile["object_array"] = pickle.dumps(np.array([1, "x"], dtype=object), protocol=4)
hostile["string_array"] = pickle.dumps(np.array(["ab"]), protocol=4)
hostile["out_of_band"] = pickle.dumps(pickle.PickleBuffer(np.arange(4, dtype=np.uint8)), protocol=5, buffer_callback=lambda b: False)
hostile["protocol_0"] = pickle.dumps((1, 2), protocol=0)
hostile["trailing"] = pickle.dumps(1, protocol=4) + b"junk"
hostile["huge_long"] = pickle.dumps(2**100, protocol=4)
hostile["set"] = pickle.dumps({1, 2}, protocol=4)
for k, v in hostile.items():
    with open(f"{out}/hostile_{k}.pkl", "wb") as f:
        f.write(v)
with open(f"{out}/hostile.json", "w") as f:
    json.dump(sorted(hostile), f)
