"""`pip install --no-build-isolation .` into a fresh virtualenv, then import from it.

Slow (a full Release build of the library): runs only with SHARDKIT_TEST_PIP=1.
"""
import os
import subprocess
import sys

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
