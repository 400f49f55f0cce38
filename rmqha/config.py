"""The generic configuration loader every rmqha process uses.

A process describes its settings as a dataclass (``rmqha/<process>/config.py``); this
module fills one from, in increasing precedence:

1. the dataclass defaults,
2. a file: TOML (``*.toml``, read with :mod:`tomllib`), a JSON object (``*.json``, as
   RocketMQ's ``rmq-proxy.json``) or a RocketMQ ``key=value`` properties file (any other
   suffix; ``#``/``!`` comments),
3. environment variables ``RMQHA_<UPPER_SNAKE_KEY>`` for keys the dataclass has,
4. explicit overrides (command-line flags).

Keys may be written snake_case or RocketMQ camelCase (``enableElectUncleanMaster``);
a field can declare extra spellings with ``field(metadata={"aliases": (...)})``.  An
unknown key (unless the dataclass's ``take_foreign_key(key, value, source)`` takes it:
a key of the product it mirrors that it does not use) or a value that does not parse as
the field's type raises :class:`rmqha.errors.ConfigError` naming the key and where it
came from.  Values are
parsed by the field's annotation: bool, int, float, str, Path, enums, lists (``;`` or
``,`` separated in text) and optionals of those.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from rmqha.errors import ConfigError

T = TypeVar("T")

ENV_PREFIX = "RMQHA_"

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_CAMEL_1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def camel_to_snake(name: str) -> str:
    """``controllerDLegerPeers`` -> ``controller_d_leger_peers``; snake_case passes through."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).replace("-", "_").lower()


def snake_to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _key_index(cls: type) -> dict[str, str]:
    """Every accepted spelling of every field -> the field name."""
    index: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        index[f.name] = f.name
        index[snake_to_camel(f.name)] = f.name
        index[camel_to_snake(snake_to_camel(f.name))] = f.name
        for alias in f.metadata.get("aliases", ()):
            index[alias] = f.name
            index[camel_to_snake(alias)] = f.name
    return index


def resolve_key(cls: type, key: str, source: str) -> str:
    """The field name a configuration key means; ConfigError if it means none."""
    index = _key_index(cls)
    name = index.get(key) or index.get(camel_to_snake(key))
    if name is None:
        raise ConfigError(f"unknown configuration key {key!r} in {source}")
    return name


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true/false, got {value!r}")


def convert(value: Any, tp: Any) -> Any:
    """Convert a TOML value or a text value to annotation ``tp``; ValueError if it can't."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
            if len(args) < len(typing.get_args(tp)):
                return None
        errors = []
        for arg in args:
            try:
                return convert(value, arg)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(tp) or (str,)
        if isinstance(value, str):
            items: list[Any] = [p.strip() for p in re.split(r"[;,]", value) if p.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ValueError(f"expected a list, got {value!r}")
        converted = [convert(v, item_tp) for v in items]
        return converted if origin is list else tuple(converted)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"expected a table, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        return _parse_bool(value)
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            return int(value.strip().replace("_", ""), 0)
        raise ValueError(f"expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ValueError(f"expected text, got {value!r}")
        return "" if value is None else (value if isinstance(value, str) else str(value))
    if tp is Path:
        return Path(os.path.expanduser(str(value)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value or str(value).strip().lower() in (
                member.name.lower(), str(member.value).lower()):
                return member
        raise ValueError(f"expected one of {[m.name for m in tp]}, got {value!r}")
    raise TypeError(f"unsupported configuration type {tp!r}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _dotted(cls: type, values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` with TOML tables that are not a field flattened to dotted keys: TOML reads
    RocketMQ's ``tls.server.mode = "enforcing"`` (or ``[tls.server] mode = ...``) as
    nested tables, and the field's alias is the dotted key."""
    index = _key_index(cls)
    out: dict[str, Any] = {}
    for key, raw in values.items():
        full = prefix + key
        if isinstance(raw, Mapping) and full not in index and camel_to_snake(full) not in index:
            out.update(_dotted(cls, raw, full + "."))
        else:
            out[full] = raw
    return out


def apply_values(config: T, values: Mapping[str, Any], source: str) -> T:
    """Set fields of ``config`` from a mapping (any key spelling); ConfigError on a bad key
    or value, naming both and ``source``."""
    cls = type(config)
    hints = _hints(cls)
    index = _key_index(cls)
    # A config mirroring another product's may accept that product's keys it has no field for.
    take_foreign = getattr(config, "take_foreign_key", None)
    for key, raw in _dotted(cls, values).items():
        known = key in index or camel_to_snake(key) in index
        if not known and callable(take_foreign) and take_foreign(key, raw, source):
            continue
        name = resolve_key(cls, key, source)
        try:
            setattr(config, name, convert(raw, hints[name]))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"bad value {raw!r} for {key!r} in {source}: {exc}") from exc
    return config


def read_properties(path: Path) -> dict[str, str]:
    """A RocketMQ ``key=value`` file: blank lines and ``#``/``!`` comments skipped."""
    values: dict[str, str] = {}
    text = path.read_text(encoding="utf-8")
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {stripped!r}")
        values[key.strip()] = value.strip()
    return values


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object of keys (RocketMQ's ``rmq-proxy.json``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path} must hold a JSON object of keys")
    return data


def read_file(path: str | Path) -> dict[str, Any]:
    """The raw key -> value mapping of a TOML, JSON or properties file."""
    p = Path(path)
    try:
        if p.suffix.lower() == ".toml":
            with p.open("rb") as fh:
                return tomllib.load(fh)
        if p.suffix.lower() == ".json":
            return read_json(p)
        return read_properties(p)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {p} is not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {p}: {exc}") from exc


def env_values(cls: type, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> dict[str, str]:
    """``RMQHA_<UPPER_SNAKE>`` variables that name a field of ``cls`` (others are ignored:
    the same prefix also carries switches such as RMQHA_NO_EXTENSIONS)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        var = prefix + f.name.upper()
        if var in env:
            out[f.name] = env[var]
    return out


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env_prefix: str = ENV_PREFIX,
) -> T:
    """Build a ``cls`` from defaults, ``path``, the environment and ``overrides``.

    ``env`` defaults to :data:`os.environ`; pass ``{}`` to ignore the environment.  If the
    dataclass has a ``validate()`` method it is called last (it raises ConfigError).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    config = cls()
    if path is not None:
        apply_values(config, read_file(path), f"file {path}")
    environ = os.environ if env is None else env
    for name, raw in env_values(cls, environ, env_prefix).items():
        apply_values(config, {name: raw}, f"environment variable {env_prefix}{name.upper()}")
    if overrides:
        apply_values(config, {k: v for k, v in overrides.items() if v is not None}, "overrides")
    validate = getattr(config, "validate", None)
    if callable(validate):
        validate()
    return config


def to_dict(config: Any, *, camel: bool = True) -> dict[str, Any]:
    """Field -> value (RocketMQ camelCase keys by default), JSON-friendly values."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[snake_to_camel(f.name) if camel else f.name] = value
    return out


def check_port_free(host: str, port: int, key: str) -> None:
    """ConfigError naming ``key`` if ``host:port`` cannot be bound right now."""
    if port == 0:
        return
    if not 0 < port < 65536:
        raise ConfigError(f"{key}: port {port} is out of range 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"{key}: {host}:{port} is not free ({exc.strerror})") from exc


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One configuration key as an operator sees it: name, other spellings, default, meaning."""

    key: str
    aliases: tuple[str, ...]
    default: str
    doc: str


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:")


def _field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines written above each field in the class source (and in the
    sources of the config classes it inherits fields from, such as :class:`TlsKeys`)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_comments(klass))
    return docs


def _own_field_comments(cls: type) -> dict[str, str]:
    import inspect

    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = _FIELD_LINE.match(line)
        if match and pending:
            docs[match.group(1)] = " ".join(pending)
        if not stripped.startswith("#"):
            pending = []
    return docs


def describe_keys(cls: type) -> list[KeyDoc]:
    """Every key of a config dataclass with its default, for ``rmqha config-keys`` and docs/configuration.md."""
    comments = _field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if isinstance(default, enum.Enum):
            default = default.value
        if isinstance(default, Path):
            default = str(default)
        if isinstance(default, (list, tuple)):
            default = ";".join(str(v) for v in default)
        aliases = tuple(dict.fromkeys((snake_to_camel(f.name), *f.metadata.get("aliases", ()))))
        aliases = tuple(a for a in aliases if a != f.name)
        out.append(KeyDoc(f.name, aliases, "" if default is None else str(default),
                          comments.get(f.name, "")))
    return out


@dataclasses.dataclass
class TlsKeys:
    """RocketMQ's ``tls.*`` keys, shared by every process's config (a TOML file may nest
    them: ``[tls.server] mode = ...``)."""

    #: This process's remoting port: disabled (plaintext), permissive (TLS and plaintext on
    #: one port, told apart by the first byte) or enforcing (TLS only).
    tls_server_mode: str = dataclasses.field(default="disabled", metadata={"aliases": ("tls.server.mode",)})
    #: PEM certificate (chain) and key of this process's TLS ports (`rmqha certs issue`);
    #: re-read when the files change, for new connections.
    tls_server_cert_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.server.certPath",)})
    #: PEM private key of that certificate.
    tls_server_key_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.server.keyPath",)})
    #: Password of an encrypted tls_server_key_path; empty = not encrypted.
    tls_server_key_password: str = dataclasses.field(default="", metadata={"aliases": ("tls.server.keyPassword",)})
    #: CA certificate(s) client certificates are checked against.
    tls_server_trust_cert_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.server.trustCertPath",)})
    #: Client certificates: none, optional (checked when sent) or require.
    tls_server_need_client_auth: str = dataclasses.field(
        default="none", metadata={"aliases": ("tls.server.need.client.auth",)})
    #: This process's own links to other cluster processes use TLS, with the tls.client.* files.
    tls_enable: bool = dataclasses.field(default=False, metadata={"aliases": ("tls.enable",)})
    #: PEM certificate (chain) this process presents when it dials with TLS (to controllers,
    #: name servers, brokers' HA ports).
    tls_client_cert_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.client.certPath",)})
    #: PEM private key of tls_client_cert_path.
    tls_client_key_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.client.keyPath",)})
    #: Password of an encrypted tls_client_key_path; empty = not encrypted.
    tls_client_key_password: str = dataclasses.field(default="", metadata={"aliases": ("tls.client.keyPassword",)})
    #: CA certificate(s) servers are checked against (by the rmqha identity they name).
    tls_client_trust_cert_path: str = dataclasses.field(default="", metadata={"aliases": ("tls.client.trustCertPath",)})
    #: Check the server's certificate (false trusts any server: never in production).
    tls_client_auth_server: bool = dataclasses.field(default=True, metadata={"aliases": ("tls.client.authServer",)})
    #: A RocketMQ tls.properties file of tls.* keys, read at start; its values win.
    tls_config_file: str = dataclasses.field(default="", metadata={"aliases": ("tls.config.file",)})
