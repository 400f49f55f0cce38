"""rmqha: a replicated, durable commit log with automatic master/slave switching."""
from __future__ import annotations

from rmqha._core import implementation as _implementation

__version__ = "0.1.0"


def core_implementation() -> str:
    """Which twin of the hot paths is in use: ``"cython"`` or ``"python"``."""
    return _implementation()


# Client classes load on first use so `import rmqha` stays light (no asyncio, lz4, ...).
_LAZY = {
    "Producer": "rmqha.client.producer",
    "Consumer": "rmqha.client.consumer",
    "BlockingProducer": "rmqha.client.blocking_producer",
    "BlockingConsumer": "rmqha.client.consumer",
    "Message": "rmqha.client.model",
    "SendResult": "rmqha.client.model",
    "SendStatus": "rmqha.client.model",
    "MessageQuery": "rmqha.client.message_query",
    "BlockingMessageQuery": "rmqha.client.message_query",
    "LocalTransactionState": "rmqha.client.transaction",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rmqha' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["core_implementation", "__version__", *_LAZY]
