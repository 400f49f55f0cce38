"""A missing compiled twin is reported once, with how to build it; chosen pure twins are not."""
from __future__ import annotations

import subprocess
import sys

_PROBE = r"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
import importlib
real_im = importlib.import_module
def im(name, package=None):
    # The compiled twins are rmqha._core.<feature> without the _py suffix.
    if name.startswith("rmqha._core.") and not name.endswith("_py"):
        raise ImportError(f"no module named {name} (simulated: not built)")
    return real_im(name, package)
importlib.import_module = im
from rmqha import _core
for f in _core.FEATURES:
    _core.load(f)
print("impl", _core.implementation())
"""


def _run(env_extra: dict[str, str]) -> str:
    import os
    env = {k: v for k, v in os.environ.items() if k != "RMQHA_NO_EXTENSIONS"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_missing_compiled_twin_warns_once_with_how_to_build() -> None:
    out = _run({})
    assert "impl python" in out
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, out
    assert "make build" in warnings[0] and "RMQHA_NO_EXTENSIONS" in warnings[0]


def test_pure_twins_chosen_on_purpose_do_not_warn() -> None:
    out = _run({"RMQHA_NO_EXTENSIONS": "1"})
    assert "impl python" in out and "WARNING" not in out
