"""JSON-line logging for every rmqha process.

Each line is one JSON object with the time, level, logger, message and the process's
context: its role in the cluster (``process``), broker group, broker id and master epoch.
The context lives in one mutable :class:`LogContext` so a broker that changes epoch updates
every later line without passing values around.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from rmqha.errors import ConfigError


@dataclass
class LogContext:
    """What every log line of this process says about where it comes from."""

    process: str = ""
    group: str | None = None
    broker_id: int | None = None
    epoch: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v not in (None, "")}
        out.update(self.extra)
        return out


#: The process-wide context; brokers update ``group``, ``broker_id`` and ``epoch`` as they learn them.
context = LogContext()

# Attributes every LogRecord has; anything else passed through ``extra=`` is emitted too.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(context.fields())
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def configure_logging(
    process: str,
    *,
    level: str | int = "INFO",
    json_lines: bool = True,
    stream: TextIO | None = None,
    path: str | None = None,
) -> None:
    """Route the root logger to one handler (stderr or a file) in JSON lines or plain text."""
    context.process = process
    handler: logging.Handler
    if path:
        try:
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"log_file {path} cannot be opened for appending: {exc.strerror or exc}") from exc
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
    if json_lines:
        handler.setFormatter(JsonLineFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    # pysyncobj logs through the root logger at DEBUG/INFO; keep it at WARNING so its
    # CRITICAL divergence warnings stay visible without drowning everything else.
    logging.getLogger("pysyncobj").setLevel(logging.WARNING)
