#!/usr/bin/env python3
"""Installs a built shardkit wheel into a fresh virtual environment and uses it the way a
user without Debian's libraries would, then proves where every library came from.

    tests/wheel_test.py WHEEL [--max-mb 40]

- The wheel's ELF files need only the manylinux allow-list and files of the wheel
  (wheel_repair.check over the installed tree: DT_NEEDED and the loader's resolution).
- In the venv's interpreter, with LD_LIBRARY_PATH unset and the working directory
  outside the checkout: import shardkit, convert a small image folder to tar shards,
  read samples back at random and compare their bytes; then /proc/self/maps must show
  no shared object loaded since the import from outside the wheel, the nvidia-* pip
  packages or the allow-list (Debian's liblmdb and the rest are on this machine, so a
  plain import would prove nothing; the maps do).
- WebP, AVIF and JPEG XL images (made with cwebp, avifenc, cjxl where installed) convert
  with a resize in the venv: the wheel's decoders work, AVIF's by dav1d beside the stubs
  that stand in for the AV1 codecs left out (wheel_repair.STUB_PREFIXES).
- The venv's bin/shardkit: --version is the project version, verify and info work and
  a usage error exits 2.
- Size: the wheel stays under --max-mb; import time is printed.
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "build_backend"))
import wheel_repair  # noqa: E402

PROBE = r'''
import json, os, random, sys
sys.path.insert(0, sys.argv[3])  # the checkout's python/build_backend (plain Python, stdlib only)
from wheel_repair import mapped_libraries as maps
before = maps()
import shardkit
src, out = sys.argv[1], sys.argv[2]
s = shardkit.convert(src, "wds:" + os.path.join(out, "t-%06d.tar"), shard_size=64 * 1024)
ds = shardkit.open(os.path.join(out, "t.manifest.json"))
rng = random.Random(7)
checked = 0
for i in rng.sample(range(len(ds)), min(len(ds), 12)):
    smp = ds[i]
    key = smp["__key__"]
    with open(os.path.join(src, key + ".jpg"), "rb") as f:
        assert bytes(smp["jpg"]) == f.read(), key
    checked += 1
print(json.dumps({"version": shardkit.__version__, "samples": len(ds), "checked": checked,
                  "shards": len(s["shards"]) if isinstance(s, dict) and "shards" in s else None,
                  "before": sorted(before), "after": sorted(maps()),
                  "file": shardkit.__file__}))
'''


# The codecs beyond JPEG and PNG that this wheel decodes, each through a resize (which
# decodes every image): an image per codec, made with Debian's cwebp, avifenc and cjxl.
CODEC_PROBE = r'''
import json, os, sys
import shardkit
src, out = sys.argv[1], sys.argv[2]
have = {"webp": shardkit.HAVE_WEBP, "avif": shardkit.HAVE_AVIF, "jxl": shardkit.HAVE_JXL}
shardkit.convert(src, "wds:" + os.path.join(out, "t-%06d.tar"), resize="max:16", encode="png")
ds = shardkit.open(os.path.join(out, "t.manifest.json"))
keys = sorted(ds[i]["__key__"] for i in range(len(ds)))
print(json.dumps({"have": have, "keys": keys}))
'''


def make_codec_folder(root):
    """root/c/img.{webp,avif,jxl} from one 48x32 PNG; {} when an encoder is missing."""
    from PIL import Image

    tools = {"webp": ["cwebp", "-quiet", "-q", "80", "{src}", "-o", "{dst}"],
             "avif": ["avifenc", "-j", "1", "-s", "8", "{src}", "{dst}"],
             "jxl": ["cjxl", "{src}", "{dst}", "--quiet"]}
    if not all(shutil.which(t[0]) for t in tools.values()):
        return {}
    d = os.path.join(root, "c")
    os.makedirs(d)
    png = os.path.join(root, "src.png")
    Image.new("RGB", (48, 32), (200, 40, 90)).save(png)
    made = {}
    for ext, cmd in tools.items():
        dst = os.path.join(d, "img_%s.%s" % (ext, ext))
        r = run([a.format(src=png, dst=dst) for a in cmd])
        if r.returncode:
            fail("%s failed: %s" % (cmd[0], r.stderr))
        made[ext] = "c/img_%s" % ext
    os.remove(png)
    return made


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def fail(msg):
    print("wheel_test: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def make_folder(root, classes=3, per_class=6):
    from PIL import Image  # the driver's interpreter (Debian's python3-pil), not the venv's

    rng = random.Random(1)
    for c in range(classes):
        d = os.path.join(root, "class%d" % c)
        os.makedirs(d)
        for i in range(per_class):
            img = Image.new("RGB", (40 + 8 * i, 32 + 4 * c), (rng.randrange(256), rng.randrange(256), 80))
            img.save(os.path.join(d, "img%02d.jpg" % i), quality=85)
    return classes * per_class


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--max-mb", type=float, default=40)
    a = ap.parse_args()
    wheel = os.path.abspath(a.wheel)
    size_mb = os.path.getsize(wheel) / 1e6
    version = re.search(r"project\(shardkit VERSION ([0-9.]+)", open(os.path.join(ROOT, "CMakeLists.txt")).read()).group(1)
    name = os.path.basename(wheel)
    if not name.startswith("shardkit-%s-cp" % version):
        fail("%s does not carry the project version %s" % (name, version))
    if not re.search(r"-manylinux_2_\d+_\w+\.whl$", name):
        fail("%s has no manylinux platform tag (was it repaired?)" % name)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    for must in ("shardkit/__init__.py", "shardkit/_cli.py", "shardkit/_bin/shardkit"):
        if must not in names:
            fail("the wheel lacks " + must)
    if not any(n.startswith("shardkit.libs/liblmdb-") for n in names):
        fail("the wheel bundles no liblmdb-<hash>.so (shardkit.libs/)")
    if size_mb > a.max_mb:
        fail("the wheel is %.1f MB, more than %.0f MB" % (size_mb, a.max_mb))

    tmp = tempfile.mkdtemp(prefix="shardkit-wheel-test-")
    try:
        venv = os.path.join(tmp, "venv")
        r = run([sys.executable, "-m", "venv", venv])
        if r.returncode:
            fail("python3 -m venv failed (Debian: python3-venv): " + r.stderr)
        py = os.path.join(venv, "bin", "python")
        r = run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check", "-q", wheel])
        if r.returncode:
            fail("pip install of the wheel failed: " + r.stderr)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "LD_PRELOAD")}
        site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"], env=env).stdout.strip()
        # The installed files: only the allow-list and the wheel's own libraries.
        try:
            tag = wheel_repair.check(site)
        except RuntimeError as e:
            fail(str(e))
        src = os.path.join(tmp, "images")
        n = make_folder(src)
        out = os.path.join(tmp, "out")
        work = os.path.join(tmp, "cwd")
        os.makedirs(work)
        t0 = time.perf_counter()
        r = run([py, "-c", "import shardkit"], env=env, cwd=work)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        run([py, "-c", "import shardkit"], env=env, cwd=work)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        run([py, "-c", "pass"], env=env, cwd=work)
        bare = time.perf_counter() - t0
        if r.returncode:
            fail("import shardkit in the venv failed:\n" + r.stderr)
        r = run([py, "-c", PROBE, src, out, os.path.join(ROOT, "python", "build_backend")], env=env, cwd=work)
        if r.returncode:
            fail("the venv's conversion and read-back failed:\n" + r.stderr)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if not res["file"].startswith(site):
            fail("shardkit was imported from %s, not the venv" % res["file"])
        if res["version"] != version or res["samples"] != n or res["checked"] == 0:
            fail("unexpected probe result: %r" % {k: res[k] for k in ("version", "samples", "checked")})
        loaded = set(res["after"]) - set(res["before"])
        outside = wheel_repair.outside_wheel(loaded, site)
        if outside:
            fail("libraries loaded from outside the wheel after import shardkit:\n  " + "\n  ".join(outside))
        ours = [p for p in loaded if os.path.realpath(site) + os.sep + "shardkit" in p]
        if not any("/shardkit.libs/liblmdb-" in p for p in ours):
            fail("the bundled liblmdb was not loaded (the maps show %d of the wheel's files)" % len(ours))
        # WebP, AVIF and JPEG XL decode inside the wheel (AVIF by dav1d: the other AV1
        # codecs libavif links are stubs there, wheel_repair.STUB_PREFIXES).
        codecs = os.path.join(tmp, "codecs")
        made = make_codec_folder(codecs)
        if made:
            r = run([py, "-c", CODEC_PROBE, codecs, os.path.join(tmp, "codecs-out")], env=env, cwd=work)
            if r.returncode:
                fail("converting WebP, AVIF and JPEG XL images with --resize in the venv failed (exit %d):\n%s"
                     % (r.returncode, r.stderr))
            got = json.loads(r.stdout.strip().splitlines()[-1])
            want = sorted(k for ext, k in made.items() if got["have"][ext])
            if got["keys"] != want:
                fail("the codec probe converted %r, expected %r" % (got["keys"], want))
            codec_note = "; %s decoded" % ", ".join(sorted(e for e in made if got["have"][e])) if want else ""
        else:
            codec_note = "; no cwebp/avifenc/cjxl here: codecs not probed"
        # The command of the wheel.
        cli = os.path.join(venv, "bin", "shardkit")
        r = run([cli, "--version"], env=env, cwd=work)
        if r.returncode or r.stdout.strip() != version:
            fail("%s --version: exit %d, %r" % (cli, r.returncode, r.stdout + r.stderr))
        r = run([cli, "verify", os.path.join(out, "t.manifest.json"), "--against", src], env=env, cwd=work)
        if r.returncode:
            fail("shardkit verify from the venv failed: " + r.stdout + r.stderr)
        r = run([cli, "info", os.path.join(out, "t.manifest.json"), "--json"], env=env, cwd=work)
        if r.returncode or json.loads(r.stdout).get("samples") != n:
            fail("shardkit info from the venv: exit %d, %s" % (r.returncode, r.stdout + r.stderr))
        r = run([cli, "convert", src], env=env, cwd=work)
        if r.returncode != 2:
            fail("a usage error from the venv's command exited %d, not 2" % r.returncode)
        print("wheel_test: ok: %s (%.1f MB, %s); %d samples converted and %d read back at random in a fresh "
              "venv; %d of the wheel's libraries mapped, none from outside; import shardkit %.3f s cold, "
              "%.3f s warm (python alone %.3f s)%s" % (name, size_mb, tag, res["samples"], res["checked"], len(ours),
                                                       cold, warm, bare, codec_note))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
