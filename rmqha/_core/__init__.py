"""The hot paths, each as a compiled twin (``<name>.pyx``) and a pure twin (``<name>_py.py``).

Both twins of a feature expose one API and write identical bytes.  :func:`load` returns the
compiled twin when it imports, unless ``RMQHA_NO_EXTENSIONS`` is set; :func:`load_twin`
returns a named twin so tests and benchmarks can run one body against both.  When a compiled
twin does not import and ``RMQHA_NO_EXTENSIONS`` is not set, one warning (per process) says
so and how to build them: the pure twins are 10-20x slower, and a client running them
silently can differ from its brokers.
"""
from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

NO_EXTENSIONS: bool = os.environ.get("RMQHA_NO_EXTENSIONS", "") not in ("", "0")

#: Every hot-path feature; each has ``rmqha/_core/<name>.pyx`` and ``<name>_py.py``.
FEATURES: tuple[str, ...] = ("records", "epoch_map", "frames", "ha_offsets", "message_index",
                             "queue_scan")

TWINS: tuple[str, ...] = ("cython", "python")

_loaded: dict[str, str] = {}
_warned = False

log = logging.getLogger(__name__)


def load_twin(feature: str, twin: str) -> ModuleType:
    """Import one named twin of a feature; ImportError if that twin is not available."""
    if feature not in FEATURES:
        raise ValueError(f"unknown hot-path feature {feature!r}; known: {', '.join(FEATURES)}")
    if twin == "cython":
        return importlib.import_module(f"rmqha._core.{feature}")
    if twin == "python":
        return importlib.import_module(f"rmqha._core.{feature}_py")
    raise ValueError(f"unknown twin {twin!r}; expected 'cython' or 'python'")


def load(feature: str) -> ModuleType:
    """The twin in use for a feature: compiled when it imports and not disabled."""
    if not NO_EXTENSIONS:
        try:
            mod = load_twin(feature, "cython")
        except ImportError as exc:
            _warn_pure(feature, exc)
        else:
            _loaded[feature] = "cython"
            return mod
    _loaded[feature] = "python"
    return load_twin(feature, "python")


def implementation() -> str:
    """``"cython"`` when every feature loads compiled, else ``"python"``."""
    for feature in FEATURES:
        if feature not in _loaded:
            load(feature)
    return "cython" if all(v == "cython" for v in _loaded.values()) else "python"


def _warn_pure(feature: str, exc: ImportError) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    log.warning(
        "rmqha: the compiled hot paths do not import (%s: %s); running the pure-Python "
        "twins, 10-20x slower. Build them with `make build` (or `python setup.py build_ext "
        "--inplace` in a source checkout, or `pip install .`); set RMQHA_NO_EXTENSIONS=1 to "
        "choose the pure twins on purpose and silence this.", feature, exc)
