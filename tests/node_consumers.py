"""Real trace consumers that run in node: Chrome DevTools' trace engine and speedscope's importer.

``node_packages()`` installs the pinned npm packages once into a cache folder
(``$CLTRACE_NODE_CACHE``, else ``~/.cache/cltrace-tests/node``), under a file lock so
parallel test runs share one install; ``run_node(script, *args)`` runs an ES module there
and returns its JSON output. Tests skip only where node or npm is not installed.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from typing import Any

import pytest

PACKAGES = {"@paulirish/trace_engine": "0.0.65", "speedscope": "1.25.0"}


def cache_dir() -> str:
    base = os.environ.get("CLTRACE_NODE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                               "cltrace-tests", "node")
    tag = "-".join(f"{n.replace('/', '_')}@{v}" for n, v in sorted(PACKAGES.items()))
    return os.path.join(base, tag)


def node_packages() -> str:
    """The folder whose node_modules holds PACKAGES (installed on first use)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the DevTools and speedscope checks need them")
    root = cache_dir()
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = os.path.join(root, ".installed")
        if not os.path.exists(done):
            with open(os.path.join(root, "package.json"), "w") as fh:
                json.dump({"name": "cltrace-test-consumers", "private": True, "type": "module"}, fh)
            specs = [f"{n}@{v}" for n, v in PACKAGES.items()]
            p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--silent", *specs],
                               cwd=root, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"npm install {' '.join(specs)} failed:\n{p.stdout}\n{p.stderr}")
            open(done, "w").close()
    return root


def run_node(script: str, *args: str, timeout: float = 120) -> Any:
    """Run ``script`` (an ES module source) with the packages importable; its stdout's last line, as JSON."""
    root = node_packages()
    path = os.path.join(root, f"check-{os.getpid()}.mjs")
    with open(path, "w") as fh:
        fh.write(script)
    try:
        p = subprocess.run(["node", path, *args], cwd=root, capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise AssertionError(f"node failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])
