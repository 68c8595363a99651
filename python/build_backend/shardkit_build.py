"""A PEP 517 build backend for shardkit's Python module, with no dependency.

`pip install --no-build-isolation .` (from the repository root) calls build_wheel(),
which configures and builds the CMake project (the library and the `_shardkit`
extension, Release, no tests, no CLI) with the running interpreter, then packs
<build>/python/shardkit/ (the package, the extension and a copy of libshardkit found
through RPATH $ORIGIN) into a wheel. No network access is needed: the C++
dependencies are the Debian packages of scripts/install-deps.sh.

Settings (pip --config-settings KEY=VALUE, or the environment):
  build-dir / SHARDKIT_BUILD_DIR   CMake build directory (default: <repo>/build-pip)
  jobs / SHARDKIT_BUILD_JOBS       parallel build jobs (default: the CPU count)
  cmake-args / SHARDKIT_CMAKE_ARGS extra CMake arguments, space separated
"""
import base64
import hashlib
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _setting(config_settings, key, env):
    if config_settings and config_settings.get(key):
        return config_settings[key]
    return os.environ.get(env) or None


def _project():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    try:
        import tomllib

        p = tomllib.loads(text)["project"]
        return p["name"], p["version"], p.get("description", ""), p.get("requires-python", "")
    except ImportError:  # Python < 3.11: the few keys we need
        def get(k):
            m = re.search(r"^%s\s*=\s*\"([^\"]*)\"" % re.escape(k), text, re.M)
            return m.group(1) if m else ""

        return get("name"), get("version"), get("description"), get("requires-python")


def _tag():
    impl = "cp%d%d" % sys.version_info[:2]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return impl, impl, plat


def _build(config_settings):
    build_dir = os.path.abspath(_setting(config_settings, "build-dir", "SHARDKIT_BUILD_DIR")
                                or os.path.join(ROOT, "build-pip"))
    jobs = _setting(config_settings, "jobs", "SHARDKIT_BUILD_JOBS") or str(os.cpu_count() or 1)
    extra = shlex.split(_setting(config_settings, "cmake-args", "SHARDKIT_CMAKE_ARGS") or "")
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DSHARDKIT_BUILD_TESTS=OFF", "-DSHARDKIT_BUILD_TOOLS=OFF", "-DSHARDKIT_BUILD_PYTHON=ON",
                 "-DPython3_EXECUTABLE=" + sys.executable] + extra
    # pip shows a build backend's output only with -v: CMake's "[ 42%]" lines also go to the
    # terminal, when there is one, so that a build of some minutes is not silent.
    try:
        tty = open("/dev/tty", "w")
    except OSError:
        tty = None
    try:
        for cmd in (configure, ["cmake", "--build", build_dir, "--target", "_shardkit", "--parallel", jobs]):
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
    return os.path.join(build_dir, "python", "shardkit")


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
    pkg_dir = _build(config_settings)
    py, abi, plat = _tag()
    dist_name = re.sub(r"[-_.]+", "_", name)
    wheel_name = "%s-%s-%s-%s-%s.whl" % (dist_name, version, py, abi, plat)
    dist_info = _dist_info(name, version)
    files = []
    for fn in sorted(os.listdir(pkg_dir)):
        if fn.endswith(".py") or ".so" in fn:
            with open(os.path.join(pkg_dir, fn), "rb") as f:
                files.append(("shardkit/" + fn, f.read()))
    if not any(n.startswith("shardkit/_shardkit") for n, _ in files):
        raise RuntimeError("the build produced no shardkit/_shardkit extension in " + pkg_dir)
    files.append((dist_info + "/METADATA", _metadata(name, version, summary, rp).encode()))
    wheel_meta = ("Wheel-Version: 1.0\nGenerator: shardkit_build\nRoot-Is-Purelib: false\n"
                  "Tag: %s-%s-%s\n" % (py, abi, plat))
    files.append((dist_info + "/WHEEL", wheel_meta.encode()))
    record = [_record_line(n, d) for n, d in files] + [dist_info + "/RECORD,,"]
    files.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if ".so" in n else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return wheel_name
