"""The package as users get it: imported beside torch in fresh interpreters, and
`pip install --no-build-isolation .` into a fresh virtualenv.

The pip test is slow (a full Release build of the library): runs only with SHARDKIT_TEST_PIP=1.
The torch tests run wherever torch is importable (Debian's python3-torch here; pip's torch on
the GPU machine through scripts/device_python.sh).
"""
import glob
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.skipif(os.environ.get("SHARDKIT_TEST_PIP") != "1", reason="set SHARDKIT_TEST_PIP=1 (slow)")
def test_pip_install_from_the_source_tree(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the build tree's copy
    subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "-q", ROOT],
                   check=True, env=dict(env, SHARDKIT_BUILD_DIR=str(tmp_path / "pip-build")))
    out = subprocess.run([py, "-c", "import shardkit, os; print(shardkit.__file__); print(shardkit.formats())"],
                         check=True, capture_output=True, text=True, cwd=str(tmp_path), env=env).stdout
    path, formats = out.splitlines()
    assert path.startswith(str(venv))  # the installed copy, not the build tree
    assert "wds" in formats


# ---- shardkit beside torch -----------------------------------------------------------------
# Issue 13: with pip's torch 2.11, `import shardkit; import torch` crashed while `import
# torch; import shardkit` worked. Causes found on the GPU machine: GNU-unique symbols (fmt,
# nlohmann-json, std::, and there, with a GCC that links libstdc++ statically, all of
# libstdc++ including std::__once_call) exported by libshardkit or by the extension module
# bind process-wide even under RTLD_LOCAL, so torch's libraries used our copies. Both now
# export only what they must (tests/exports_test.sh, ctest python_module_exports); the CUDA
# runtime is linked statically. docs/python.md has the story. Each case runs in a fresh
# interpreter: a crash kills only the child.

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def run_fresh(code, timeout=300):
    """Runs `code` in a fresh interpreter (same PYTHONPATH); asserts a clean exit."""
    code = textwrap.dedent(code) + "\nprint('fresh-interpreter-ok', flush=True)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    report = f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, report
    assert "fresh-interpreter-ok" in r.stdout, report
    assert "invalid pointer" not in r.stderr, report
    return r.stdout


# Uses both libraries once both are loaded, so a bad binding shows up before exit too.
USE_BOTH = """
t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
assert float(t.sum()) == 15.0
assert "wds" in shardkit.formats()
"""


@needs_torch
def test_import_shardkit_then_torch():
    run_fresh("import shardkit\nimport torch\n" + USE_BOTH)


@needs_torch
def test_import_torch_then_shardkit():
    run_fresh("import torch\nimport shardkit\n" + USE_BOTH)


@needs_torch
def test_packaged_library_loaded_alone_then_torch():
    # The copy of libshardkit inside the package, loaded the way any other program would.
    import shardkit

    libs = glob.glob(os.path.join(os.path.dirname(shardkit.__file__), "libshardkit.so.*"))
    assert libs, "no libshardkit.so.* beside " + shardkit.__file__
    run_fresh(f"""
        import ctypes
        lib = ctypes.CDLL({libs[0]!r})
        import torch
        assert float(torch.ones(4).sum()) == 4.0
        """)


@needs_torch
def test_convert_then_import_torch(tmp_path):
    import shardkit

    if not shardkit.HAVE_CONVERT:
        pytest.skip("no convert pipeline in this build")
    from conftest import make_image_folder

    make_image_folder(str(tmp_path / "imgs"))
    out = run_fresh(f"""
        import shardkit
        s = shardkit.convert("folder:" + {str(tmp_path / "imgs")!r}, "wds:" + {str(tmp_path / "o-%06d.tar")!r},
                             samples_per_shard=10)
        print("samples", s["samples"])
        import torch
        ds = shardkit.open("wds:" + {str(tmp_path / "o-{000000..000002}.tar")!r})
        assert len(ds) == 24
        assert float(torch.tensor(list(ds[0]["jpg"][:4])).sum()) > 0
        """)
    assert "samples 24" in out
