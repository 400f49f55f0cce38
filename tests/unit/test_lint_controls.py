"""Negative controls of `make lint`'s own checks: each one fires on the fault it is there for.

- the import rules (ARCHITECTURE.md's map, import-linter contracts in pyproject.toml):
  a copy of the package keeps every contract, and a forbidden import written into the copy
  breaks the contract that forbids it;
- the twins' API (``rmqha/_core/_protocols.py``, checked by mypy): a twin without one of
  its feature's functions is refused;
- the compiled twins' stubs (``rmqha/_core/*.pyi``, checked by stubtest against the built
  extensions): a stub whose signature differs from the extension is refused.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(args: list[str], cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def _package_copy(dest: Path, *, compiled: bool = False) -> Path:
    """rmqha's sources (and, with ``compiled``, its built extensions) under ``dest``."""
    skip = ["__pycache__", "*.c", "*.html"] + ([] if compiled else ["*.so"])
    shutil.copytree(ROOT / "rmqha", dest / "rmqha", ignore=shutil.ignore_patterns(*skip))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return _run([str(BIN / "lint-imports"), "--no-cache", "--no-logo"], root, root)


def test_the_package_as_it_is_keeps_every_import_contract(tmp_path: Path) -> None:
    res = _lint_imports(_package_copy(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


#: (module of the copy, the line written into it, the contract that must break)
FORBIDDEN = [
    ("rmqha/protocol/topics.py", "from rmqha.net import loop", "layers"),
    ("rmqha/broker/identity.py", "import rmqha.testing.ha", "layers"),
    ("rmqha/store/scrub.py", "from rmqha.net import client", "store"),
    ("rmqha/net/server.py", "from rmqha import _core", "net"),
    ("rmqha/client/model.py", "from rmqha import config", "client"),
    ("rmqha/messaging/assignment.py", "from rmqha.client import route", "servers"),
]


@pytest.mark.parametrize(("module", "line", "contract"), FORBIDDEN,
                         ids=["protocol->net", "broker->testing", "store->net", "net->_core",
                              "client->config", "messaging->client"])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                contract: str) -> None:
    root = _package_copy(tmp_path)
    with open(root / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # the negative control's forbidden import\n")
    res = _lint_imports(root)
    assert res.returncode != 0, res.stdout
    broken = [ln.split(":")[0] for ln in res.stdout.splitlines() if ln.endswith(" BROKEN")]
    assert broken == [contract], res.stdout
    assert module.removesuffix(".py").replace("/", ".") in res.stdout


def test_a_package_missing_from_the_map_breaks_the_layers(tmp_path: Path) -> None:
    root = _package_copy(tmp_path)
    (root / "rmqha" / "newcomer").mkdir()
    (root / "rmqha" / "newcomer" / "__init__.py").write_text('"""Not on the map."""\n')
    res = _lint_imports(root)
    assert res.returncode != 0, res.stdout
    assert "rmqha.newcomer" in res.stdout


def test_a_twin_missing_a_function_is_refused_by_its_protocol(tmp_path: Path) -> None:
    pure = (ROOT / "rmqha" / "_core" / "ha_offsets_py.py").read_text(encoding="utf-8")
    assert "def should_shrink(" in pure
    # The drifted twin: should_shrink renamed away, the rest as it is.
    (tmp_path / "drifted_twin.py").write_text(pure.replace("def should_shrink(", "def _gone("))
    (tmp_path / "check.py").write_text(
        "from rmqha._core import ha_offsets_py\n"
        "from rmqha._core._protocols import HaOffsetsTwin\n\n"
        "import drifted_twin\n\n"
        "good: HaOffsetsTwin = ha_offsets_py\n"
        "bad: HaOffsetsTwin = drifted_twin\n")
    res = _run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", "check.py"],
               tmp_path, ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    errors = [ln for ln in res.stdout.splitlines() if ": error:" in ln]
    assert errors and all(ln.startswith("check.py:7:") for ln in errors), res.stdout
    assert "should_shrink" in res.stdout


def test_a_stub_that_differs_from_its_extension_is_refused(tmp_path: Path) -> None:
    built = list((ROOT / "rmqha" / "_core").glob("queue_scan*.so"))
    assert built, "the compiled twins are not built (make build)"
    root = _package_copy(tmp_path, compiled=True)
    stub = root / "rmqha" / "_core" / "queue_scan.pyi"
    text = stub.read_text(encoding="utf-8")
    assert "def java_hash_ascii(raw: bytes)" in text
    stub.write_text(text.replace("def java_hash_ascii(raw: bytes)", "def java_hash_ascii(data: bytes)"))
    allow = root / "rmqha" / "_core" / "stubtest_allowlist.txt"
    res = _run([sys.executable, "-m", "mypy.stubtest", "--mypy-config-file",
                str(root / "pyproject.toml"), "--allowlist", str(allow),
                "rmqha._core.queue_scan"], root, root)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "rmqha._core.queue_scan.java_hash_ascii is inconsistent" in res.stdout, res.stdout
