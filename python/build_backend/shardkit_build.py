"""A PEP 517 build backend for shardkit, with no dependency beyond Debian's tools.

`pip wheel --no-build-isolation .`, `python3 -m build --wheel --no-isolation` or
`pip install --no-build-isolation .` (from the repository root) call build_wheel(), which
configures and builds the CMake project (the library, the `_shardkit` extension and the
`shardkit` command; no tests, no MPI) with the running interpreter, stages the package
(Python files, the extension, libshardkit under its soname, the command as
shardkit/_bin/shardkit), strips debug information and symbol tables (the dynamic
symbols stay), and repairs it (wheel_repair.py: every library beyond glibc, libgcc_s and
libstdc++ is bundled under shardkit.libs/ with a hashed soname, RUNPATHs are
$ORIGIN-relative, and a library left outside fails the build). The wheel's platform tag
is manylinux_2_X, X from the newest glibc symbol its files need. The command is on PATH
through the entry point shardkit._cli:main.
build_sdist() packs the source tree (what git tracks) with PKG-INFO.

The version is CMake's project(VERSION) (CMakeLists.txt), the only place it is written.

Settings (pip --config-settings KEY=VALUE, or the environment):
  build-dir / SHARDKIT_BUILD_DIR   CMake build directory (default: <repo>/build-pip)
  build-type / SHARDKIT_BUILD_TYPE CMake build type (default RelWithDebInfo, the type the
                                   tests build, so that ccache shares its objects;
                                   debug information and symbol tables are stripped
                                   from the wheel)
  jobs / SHARDKIT_BUILD_JOBS       parallel build jobs (default: the CPU count)
  cmake-args / SHARDKIT_CMAKE_ARGS extra CMake arguments, space separated
  repair / SHARDKIT_WHEEL_REPAIR   "off": no bundling (a wheel for this machine only,
                                   tagged linux_<arch>)
  external / SHARDKIT_WHEEL_EXTERNAL sonames left to the target machine, space separated
                                   (the GPU build: libcudart.so.N libnvjpeg.so.N, which
                                   shardkit loads from pip's nvidia-* packages)
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wheel_repair  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _setting(config_settings, key, env):
    if config_settings and config_settings.get(key):
        return config_settings[key]
    return os.environ.get(env) or None


def _version():
    text = open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*shardkit\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(shardkit VERSION x.y.z)")
    return m.group(1)


def _project():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    try:
        import tomllib

        p = tomllib.loads(text)["project"]
        return p["name"], _version(), p.get("description", ""), p.get("requires-python", "")
    except ImportError:  # Python < 3.11: the few keys we need
        def get(k):
            m = re.search(r"^%s\s*=\s*\"([^\"]*)\"" % re.escape(k), text, re.M)
            return m.group(1) if m else ""

        return get("name"), _version(), get("description"), get("requires-python")


def _tag(platform=None):
    impl = "cp%d%d" % sys.version_info[:2]
    plat = platform or sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return impl, impl, plat


def _build(config_settings):
    build_dir = os.path.abspath(_setting(config_settings, "build-dir", "SHARDKIT_BUILD_DIR")
                                or os.path.join(ROOT, "build-pip"))
    build_type = _setting(config_settings, "build-type", "SHARDKIT_BUILD_TYPE") or "RelWithDebInfo"
    jobs = _setting(config_settings, "jobs", "SHARDKIT_BUILD_JOBS") or str(os.cpu_count() or 1)
    extra = shlex.split(_setting(config_settings, "cmake-args", "SHARDKIT_CMAKE_ARGS") or "")
    # MPI stays out: a bundled MPI would not match the cluster's mpirun (the command's
    # `--part env` still reads the launcher's rank variables; merge is run once after).
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=" + build_type,
                 "-DSHARDKIT_BUILD_TESTS=OFF", "-DSHARDKIT_BUILD_TOOLS=ON", "-DSHARDKIT_BUILD_BENCH=OFF",
                 "-DSHARDKIT_WITH_MPI=OFF", "-DSHARDKIT_BUILD_PYTHON=ON",
                 "-DPython3_EXECUTABLE=" + sys.executable] + extra
    build = ["cmake", "--build", build_dir, "--target", "_shardkit", "shardkit_cli", "--parallel", jobs]
    # pip shows a build backend's output only with -v: CMake's "[ 42%]" lines also go to the
    # terminal, when there is one, so that a build of some minutes is not silent.
    try:
        tty = open("/dev/tty", "w")
    except OSError:
        tty = None
    try:
        for cmd in (configure, build):
            print("shardkit build:", " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                sys.stderr.write(line)
                if tty and line.startswith("["):
                    tty.write("\rshardkit build: " + line.strip()[:100].ljust(100))
                    tty.flush()
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, cmd)
        if tty:
            tty.write("\n")
    finally:
        if tty:
            tty.close()
    return os.path.join(build_dir, "python", "shardkit"), os.path.join(build_dir, "tools", "shardkit")


def _stage(config_settings, pkg_dir, cli, stage):
    """The wheel's top level in `stage`: shardkit/ (+ shardkit.libs/ once repaired).
    Returns the platform tag."""
    pkg = os.path.join(stage, "shardkit")
    os.makedirs(os.path.join(pkg, "_bin"))
    for fn in sorted(os.listdir(pkg_dir)):
        if fn.endswith(".py") or ".so" in fn:
            shutil.copyfile(os.path.join(pkg_dir, fn), os.path.join(pkg, fn))
    if not any(fn.startswith("_shardkit") for fn in os.listdir(pkg)):
        raise RuntimeError("the build produced no shardkit/_shardkit extension in " + pkg_dir)
    shutil.copyfile(cli, os.path.join(pkg, "_bin", "shardkit"))
    for dirpath, _, files in os.walk(pkg):
        for fn in files:
            p = os.path.join(dirpath, fn)
            if wheel_repair.is_elf(p):
                os.chmod(p, 0o755)
                subprocess.run(["objcopy", "--strip-unneeded", p], check=True)
    if (_setting(config_settings, "repair", "SHARDKIT_WHEEL_REPAIR") or "on") == "off":
        return None
    external = shlex.split(_setting(config_settings, "external", "SHARDKIT_WHEEL_EXTERNAL") or "")
    return wheel_repair.repair(stage, external, log=lambda m: print("shardkit wheel:", m, file=sys.stderr))


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _metadata(name, version, summary, requires_python):
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version]
    if summary:
        lines.append("Summary: " + summary)
    if requires_python:
        lines.append("Requires-Python: " + requires_python)
    lines.append("Provides-Extra: torch")
    lines.append('Requires-Dist: torch; extra == "torch"')
    return "\n".join(lines) + "\n"


def _dist_info(name, version):
    return "%s-%s.dist-info" % (re.sub(r"[-_.]+", "_", name), version)


# ---- PEP 517 hooks -----------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name, version, summary, rp = _project()
    d = os.path.join(metadata_directory, _dist_info(name, version))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(name, version, summary, rp))
    return os.path.basename(d)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name, version, summary, rp = _project()
    pkg_dir, cli = _build(config_settings)
    stage = tempfile.mkdtemp(prefix="shardkit-wheel-")
    try:
        platform = _stage(config_settings, pkg_dir, cli, stage)
        py, abi, plat = _tag(platform)
        dist_name = re.sub(r"[-_.]+", "_", name)
        wheel_name = "%s-%s-%s-%s-%s.whl" % (dist_name, version, py, abi, plat)
        dist_info = _dist_info(name, version)
        files = []  # (arcname, bytes, executable)
        for dirpath, dirs, fns in os.walk(stage):
            dirs.sort()
            for fn in sorted(fns):
                p = os.path.join(dirpath, fn)
                with open(p, "rb") as f:
                    files.append((os.path.relpath(p, stage), f.read(), os.access(p, os.X_OK)))
        files.append((dist_info + "/METADATA", _metadata(name, version, summary, rp).encode(), False))
        wheel_meta = ("Wheel-Version: 1.0\nGenerator: shardkit_build\nRoot-Is-Purelib: false\n"
                      "Tag: %s-%s-%s\n" % (py, abi, plat))
        files.append((dist_info + "/WHEEL", wheel_meta.encode(), False))
        files.append((dist_info + "/entry_points.txt", b"[console_scripts]\nshardkit = shardkit._cli:main\n", False))
        record = [_record_line(n, d) for n, d, _ in files] + [dist_info + "/RECORD,,"]
        files.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode(), False))
        os.makedirs(wheel_directory, exist_ok=True)
        path = os.path.join(wheel_directory, wheel_name)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for n, d, x in files:
                info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (0o100755 if x else 0o100644) << 16  # S_IFREG: pip keeps +x only then
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, d)
        print("shardkit wheel: %s (%.1f MB)" % (path, os.path.getsize(path) / 1e6), file=sys.stderr)
        return wheel_name
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _source_files():
    """The tracked files of the checkout (git ls-files), or, outside git (an unpacked
    sdist), every file but build output."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout.decode()
        return sorted(f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f)))
    except (OSError, subprocess.CalledProcessError):
        skip = re.compile(r"^(build[^/]*|\.git|\.deps|\.npm-deps|dist)(/|$)")
        out = []
        for dirpath, dirs, fns in os.walk(ROOT):
            rel = os.path.relpath(dirpath, ROOT)
            dirs[:] = sorted(d for d in dirs if not skip.match(os.path.normpath(os.path.join(rel, d))))
            out += [os.path.normpath(os.path.join(rel, f)) for f in fns]
        return sorted(f for f in out if f != "PKG-INFO")


def build_sdist(sdist_directory, config_settings=None):
    name, version, summary, rp = _project()
    base = "%s-%s" % (re.sub(r"[-_.]+", "_", name), version)
    os.makedirs(sdist_directory, exist_ok=True)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in _source_files():
            info = t.gettarinfo(os.path.join(ROOT, rel), arcname=base + "/" + rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 1577836800
            with open(os.path.join(ROOT, rel), "rb") as f:
                t.addfile(info, f)
        data = _metadata(name, version, summary, rp).encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size = len(data)
        info.mtime = 1577836800
        t.addfile(info, io.BytesIO(data))
    return os.path.basename(path)
