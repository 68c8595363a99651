"""Makes a built package directory self-contained, as auditwheel's repair does, with
Debian's patchelf and binutils only.

    python3 wheel_repair.py PKG_ROOT [--external SONAME ...]

PKG_ROOT holds the wheel's top level: shardkit/ (the package with its ELF files: the
extension, libshardkit.so.N, _bin/shardkit). Every shared library those files need that
is not on the allow-list (glibc's libraries, libgcc_s, libstdc++, the CUDA driver) and
not named with --external is copied into PKG_ROOT/shardkit.libs/ under a unique name
(the soname with a hash of the file's bytes: libpng16-1a2b3c4d.so.16, as auditwheel
names them), its soname set to that name, and every DT_NEEDED entry that named it
rewritten. RUNPATHs become $ORIGIN-relative. Then every ELF file is checked again: a
DT_NEEDED entry outside the allow-list, the bundled names and --external fails the
repair (a wheel that misses a library fails here, not on a user's machine).

Returns (from repair()) the platform tag the files allow: manylinux_2_X_<arch>, X being
the newest GLIBC symbol version any of them needs.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys

# glibc's libraries, the compiler's runtime and the CUDA driver (which comes with the
# driver, never with a wheel): what a manylinux wheel may need from the system.
ALLOWED = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
    "libresolv.so.2", "libnsl.so.1", "libanl.so.1", "libmvec.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
    "libgcc_s.so.1", "libstdc++.so.6",
    "libcuda.so.1",
}
LIBS_DIR = "shardkit.libs"

# Libraries that a bundled library links but shardkit never calls. Debian's libavif links
# every AV1 codec it was built with: the aom, rav1e and SVT-AV1 encoders and two more
# decoders (libgav1, with abseil, and aom's), 17 MB of the wheel's libraries, while
# shardkit only decodes AVIF, with dav1d (decode/codecs.cc asks libavif for it). Where
# dav1d is bundled these are left out, and one small library built here, STUB_NAME,
# defines every function the bundled files import from them; each writes its name and
# aborts, so a call that should never come cannot pass unnoticed.
STUB_PREFIXES = ("libaom.so", "librav1e.so", "libSvtAv1Enc.so", "libgav1.so")
STUB_KEEPS = "libdav1d.so"
STUB_NAME = "libshardkit-av1-stubs.so"


def _run(cmd):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed(path):
    """The DT_NEEDED entries of an ELF file, in order."""
    out = _run(["readelf", "-d", "-W", path])
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def soname(path):
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", _run(["readelf", "-d", "-W", path]))
    return m.group(1) if m else None


def resolve_all(path, env):
    """soname -> absolute path of every library `path` loads, as the dynamic loader finds
    them (ldd), with LD_LIBRARY_PATH as in `env`."""
    out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env).stdout
    found, missing = {}, []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(not found|\S+)", line)
        if not m:
            continue
        if m.group(2) == "not found":
            missing.append(m.group(1))
        else:
            found[m.group(1)] = m.group(2)
    return found, missing


def glibc_versions(path):
    out = _run(["objdump", "-T", path])
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", out)}


def _dynamic_symbols(path, defined):
    """{name: type} of the dynamic symbols `path` defines (defined) or imports (not):
    type "F" for a function, "O" for an object, "" otherwise."""
    out = {}
    for line in _run(["objdump", "-T", path]).splitlines():
        m = re.match(r"^[0-9a-f]+\s+(.{7})\s+(\S+)\s+[0-9a-f]+\s+(?:\S+\s+)?(\S+)$", line)
        if not m:
            continue
        flags, section, name = m.groups()
        if (section != "*UND*") != defined:
            continue
        out[name] = "F" if "F" in flags else "O" if "O" in flags else ""
    return out


def _stub_source(imports):
    """C source of STUB_NAME: one aborting function per (symbol, library) of `imports`."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>",
             "static void sk_left_out(const char* f, const char* lib) {",
             '  fprintf(stderr, "shardkit: %s of %s was called, and this wheel leaves %s out (shardkit decodes '
             'AVIF with dav1d only)\\n", f, lib, lib);',
             "  abort();", "}"]
    for sym, lib in sorted(imports):
        lines.append('void %s(void) { sk_left_out("%s", "%s"); }' % (sym, sym, lib))
    return "\n".join(lines) + "\n"


def _plan_stubs(bundle, own, log):
    """Of `bundle` (soname -> path), the libraries to leave out for STUB_NAME and the
    functions it must define: (left_out names, {file soname or path: [stubbed names it
    needs]}, [(symbol, library)]). Nothing is left out unless dav1d is bundled and every
    symbol imported from a left-out library is a function of it."""
    if not any(n.startswith(STUB_KEEPS) for n in bundle):
        return set(), {}, []
    stubbed = {n for n in bundle if n.startswith(STUB_PREFIXES)}
    if not stubbed:
        return set(), {}, []
    # What stays: the libraries reachable from our own files without passing a stubbed one.
    keep, todo = set(), list(own)
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for n in needed(p):
            if n in bundle and n not in stubbed and n not in keep:
                keep.add(n)
                todo.append(bundle[n])
    users, imports = {}, set()
    defined = {n: _dynamic_symbols(bundle[n], True) for n in stubbed}
    for p in [bundle[n] for n in sorted(keep)] + list(own):
        wants = [n for n in needed(p) if n in stubbed]
        if not wants:
            continue
        users[p] = wants
        for sym in _dynamic_symbols(p, False):
            for n in wants:
                if sym in defined[n]:
                    if defined[n][sym] != "F":
                        log("not leaving out %s: %s imports its %s, which is not a function" % (n, p, sym))
                        return set(), {}, []
                    imports.add((sym, n))
    left_out = set(bundle) - keep
    return left_out, users, sorted(imports)


def _build_stubs(libs, imports):
    src = os.path.join(libs, STUB_NAME + ".c")
    with open(src, "w") as f:
        f.write(_stub_source(imports))
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("wheel repair needs a C compiler for %s (Debian: build-essential)" % STUB_NAME)
    try:
        _run([cc, "-shared", "-fPIC", "-O2", "-s", "-o", os.path.join(libs, STUB_NAME), src,
              "-Wl,-soname," + STUB_NAME])
    finally:
        os.remove(src)


def _unique_name(name, data):
    digest = hashlib.sha256(data).hexdigest()[:8]
    base, sep, rest = name.partition(".so")
    return "%s-%s%s%s" % (base, digest, sep, rest)


def _patchelf(*args):
    _run(["patchelf"] + list(args))


def _elf_files(root):
    for dirpath, _, files in os.walk(root):
        for fn in sorted(files):
            p = os.path.join(dirpath, fn)
            if not os.path.islink(p) and is_elf(p):
                yield p


def _names(files):
    """The file names and sonames of `files` (one readelf each)."""
    out = set()
    for p in files:
        out.add(os.path.basename(p))
        n = soname(p)
        if n:
            out.add(n)
    return out


def mapped_libraries():
    """The shared objects mapped into this process (/proc/self/maps), as real paths."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                out.add(os.path.realpath(parts[5].strip()))
    return out


# The NVIDIA driver's own libraries: libcuda and what it loads (libnvidia-*, libnvcuvid
# for the JPEG engines) come with the driver, never with a wheel.
DRIVER_PREFIXES = ("libcuda.so", "libnvidia-", "libnvcuvid.so")


def outside_wheel(paths, site, driver=False):
    """Of `paths` (mapped libraries), those loaded from neither the wheel installed under
    `site` (site-packages: shardkit/, shardkit.libs/), pip's nvidia-* packages, the
    allow-list, nor, with `driver`, the NVIDIA driver."""
    inside = tuple(os.path.realpath(os.path.join(site, d)) + os.sep for d in ("shardkit", "shardkit.libs", "nvidia"))
    allowed = {a.split(".so")[0] for a in ALLOWED}
    return sorted(p for p in paths
                  if not p.startswith(inside) and os.path.basename(p).split(".so")[0] not in allowed
                  and not (driver and os.path.basename(p).startswith(DRIVER_PREFIXES)))


def repair(pkg_root, external=(), log=lambda m: None):
    if not shutil.which("patchelf"):
        raise RuntimeError("wheel repair needs patchelf (Debian: apt-get install patchelf)")
    external = set(external)
    pkg = os.path.join(pkg_root, "shardkit")
    libs = os.path.join(pkg_root, LIBS_DIR)
    own = list(_elf_files(pkg))
    own_names = _names(own)
    env = dict(os.environ)
    # What each of our files loads, resolved as the build found them (the package's own
    # directory first, then the caller's LD_LIBRARY_PATH: a toolchain's libraries
    # unpacked off the system paths); check() below then resolves without it.
    where = {}
    for p in own:
        lib_path = ":".join(x for x in (pkg, env.get("LD_LIBRARY_PATH", "")) if x)
        found, missing = resolve_all(p, dict(env, LD_LIBRARY_PATH=lib_path))
        missing = [m for m in missing if m not in external]
        if missing:
            raise RuntimeError("%s needs %s, which this machine does not have" % (p, ", ".join(missing)))
        where.update(found)
    bundle = {n: path for n, path in where.items()
              if n not in ALLOWED and n not in external and n not in own_names}
    os.makedirs(libs, exist_ok=True)
    left_out, users, imports = _plan_stubs(bundle, own, log)
    if left_out:
        _build_stubs(libs, imports)
        for n in sorted(left_out):
            k = sum(1 for _, lib in imports if lib == n)
            log("left out %s (%.1f MB): %s" % (
                n, os.path.getsize(bundle[n]) / 1e6,
                "%d of its functions are stubs in %s/%s" % (k, LIBS_DIR, STUB_NAME) if k
                else "only libraries left out need it"))
    path_of_name = {q: n for n, q in bundle.items()}
    bundle = {n: p for n, p in bundle.items() if n not in left_out}
    renamed = {}
    for name, path in sorted(bundle.items()):
        with open(path, "rb") as f:
            data = f.read()
        new = _unique_name(name, data)
        dst = os.path.join(libs, new)
        with open(dst, "wb") as f:
            f.write(data)
        os.chmod(dst, 0o755)
        renamed[name] = new
        log("bundled %s (%s, %.1f MB) as %s/%s" % (name, path, len(data) / 1e6, LIBS_DIR, new))
    for p, wants in users.items():  # the left-out libraries they need become the stubs
        name = path_of_name.get(p)
        target = os.path.join(libs, renamed[name]) if name else p
        args = []
        for n in wants:
            args += ["--remove-needed", n]
        _patchelf(*args, "--add-needed", STUB_NAME, target)
    for name, new in renamed.items():
        dst = os.path.join(libs, new)
        _patchelf("--set-soname", new, dst)
        _patchelf("--set-rpath", "$ORIGIN", dst)
    for p in list(_elf_files(libs)) + own:
        args = []
        for n in needed(p):
            if n in renamed:
                args += ["--replace-needed", n, renamed[n]]
        if args:
            _patchelf(*args, p)
        if p in own:
            rel = os.path.relpath(libs, os.path.dirname(p))
            here = os.path.relpath(pkg, os.path.dirname(p))
            paths = ["$ORIGIN" if here == "." else "$ORIGIN/" + here, "$ORIGIN/" + rel]
            _patchelf("--set-rpath", ":".join(paths), p)
    return check(pkg_root, external)


def check(pkg_root, external=()):
    """Fails unless every ELF file under pkg_root needs only the allow-list, files of the
    wheel and `external`, and the loader finds each of those inside the wheel. Returns the
    manylinux platform tag."""
    external = set(external)
    files = list(_elf_files(pkg_root))
    names = _names(files)
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    newest = (2, 17)
    problems = []
    root = os.path.realpath(pkg_root)
    for p in files:
        for n in needed(p):
            if n not in ALLOWED and n not in names and n not in external:
                problems.append("%s needs %s: neither bundled nor on the allow-list" % (p, n))
        found, _ = resolve_all(p, env)
        for n, path in found.items():
            if n in ALLOWED or n in external:
                continue
            if not os.path.realpath(path).startswith(root + os.sep):
                problems.append("%s loads %s from %s, outside the wheel" % (p, n, path))
        for v in glibc_versions(p):
            newest = max(newest, v[:2])
    if problems:
        raise RuntimeError("wheel repair check failed:\n  " + "\n  ".join(problems))
    arch = os.uname().machine
    return "manylinux_%d_%d_%s" % (newest[0], newest[1], arch)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pkg_root")
    ap.add_argument("--external", action="append", default=[])
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args()
    if a.check_only:
        print(check(a.pkg_root, a.external))
    else:
        print(repair(a.pkg_root, a.external, log=lambda m: print(m, file=sys.stderr)))
