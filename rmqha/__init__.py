"""rmqha: a replicated, durable commit log with automatic master/slave switching."""
from __future__ import annotations

from rmqha._core import implementation as _implementation

__version__ = "0.1.0"


def core_implementation() -> str:
    """Which twin of the hot paths is in use: ``"cython"`` or ``"python"``."""
    return _implementation()


__all__ = ["core_implementation", "__version__"]
