"""The hot paths, each as a compiled twin (``<name>.pyx``) and a pure twin (``<name>_py.py``).

Both twins of a feature expose one API and write identical bytes.  :func:`load` returns the
compiled twin when it imports, unless ``RMQHA_NO_EXTENSIONS`` is set; :func:`load_twin`
returns a named twin so tests and benchmarks can run one body against both.  When a compiled
twin does not import and ``RMQHA_NO_EXTENSIONS`` is not set, one warning (per process) says
so and how to build them: the pure twins are 10-20x slower, and a client running them
silently can differ from its brokers.

Both functions are typed per feature: ``load("records")`` is a
:class:`~rmqha._core._protocols.RecordsTwin`, and so on (see :mod:`rmqha._core._protocols`;
the compiled twins' types are the ``.pyi`` stubs beside them).
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Literal, overload

from rmqha._core._protocols import (
    AckTableTwin,
    EpochMapTwin,
    FramesTwin,
    HaOffsetsTwin,
    MessageIndexTwin,
    PullAnswerTwin,
    QueueScanTwin,
    RecordsTwin,
    SendCodecTwin,
    SendFramesTwin,
)

#: What a feature named by a plain string (not a literal) loads as.
AnyTwin = (RecordsTwin | EpochMapTwin | FramesTwin | HaOffsetsTwin | MessageIndexTwin
           | QueueScanTwin | SendCodecTwin | PullAnswerTwin | SendFramesTwin | AckTableTwin)

NO_EXTENSIONS: bool = os.environ.get("RMQHA_NO_EXTENSIONS", "") not in ("", "0")

#: Every hot-path feature; each has ``rmqha/_core/<name>.pyx`` and ``<name>_py.py``.
FEATURES: tuple[str, ...] = ("records", "epoch_map", "frames", "ha_offsets", "message_index",
                             "queue_scan", "send_codec", "pull_answer", "send_frames", "ack_table")

TWINS: tuple[str, ...] = ("cython", "python")

_loaded: dict[str, str] = {}
_warned = False

log = logging.getLogger(__name__)


@overload
def load_twin(feature: Literal["records"], twin: str) -> RecordsTwin: ...
@overload
def load_twin(feature: Literal["epoch_map"], twin: str) -> EpochMapTwin: ...
@overload
def load_twin(feature: Literal["frames"], twin: str) -> FramesTwin: ...
@overload
def load_twin(feature: Literal["ha_offsets"], twin: str) -> HaOffsetsTwin: ...
@overload
def load_twin(feature: Literal["message_index"], twin: str) -> MessageIndexTwin: ...
@overload
def load_twin(feature: Literal["queue_scan"], twin: str) -> QueueScanTwin: ...
@overload
def load_twin(feature: Literal["send_codec"], twin: str) -> SendCodecTwin: ...
@overload
def load_twin(feature: Literal["pull_answer"], twin: str) -> PullAnswerTwin: ...
@overload
def load_twin(feature: Literal["send_frames"], twin: str) -> SendFramesTwin: ...
@overload
def load_twin(feature: Literal["ack_table"], twin: str) -> AckTableTwin: ...
@overload
def load_twin(feature: str, twin: str) -> AnyTwin: ...
def load_twin(feature: str, twin: str) -> Any:
    """Import one named twin of a feature; ImportError if that twin is not available."""
    if feature not in FEATURES:
        raise ValueError(f"unknown hot-path feature {feature!r}; known: {', '.join(FEATURES)}")
    if twin == "cython":
        return importlib.import_module(f"rmqha._core.{feature}")
    if twin == "python":
        return importlib.import_module(f"rmqha._core.{feature}_py")
    raise ValueError(f"unknown twin {twin!r}; expected 'cython' or 'python'")


@overload
def load(feature: Literal["records"]) -> RecordsTwin: ...
@overload
def load(feature: Literal["epoch_map"]) -> EpochMapTwin: ...
@overload
def load(feature: Literal["frames"]) -> FramesTwin: ...
@overload
def load(feature: Literal["ha_offsets"]) -> HaOffsetsTwin: ...
@overload
def load(feature: Literal["message_index"]) -> MessageIndexTwin: ...
@overload
def load(feature: Literal["queue_scan"]) -> QueueScanTwin: ...
@overload
def load(feature: Literal["send_codec"]) -> SendCodecTwin: ...
@overload
def load(feature: Literal["pull_answer"]) -> PullAnswerTwin: ...
@overload
def load(feature: Literal["send_frames"]) -> SendFramesTwin: ...
@overload
def load(feature: Literal["ack_table"]) -> AckTableTwin: ...
@overload
def load(feature: str) -> AnyTwin: ...
def load(feature: str) -> Any:
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
