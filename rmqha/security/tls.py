"""TLS for rmqha's ports, with RocketMQ's modes and configuration keys.

Server modes (``tls.server.mode``, RocketMQ's ``TlsMode``):

- ``disabled``: plaintext only; a connection that opens with a TLS handshake is closed
- ``permissive``: one port serves both; the first byte tells them apart (0x16 opens a TLS
  handshake record, a remoting frame opens with its length's high byte, 0 in practice)
- ``enforcing``: TLS only; a plaintext connection is closed

Keys (RocketMQ's ``TlsSystemConfig`` names): ``tls.server.certPath``, ``tls.server.keyPath``,
``tls.server.keyPassword``, ``tls.server.trustCertPath``, ``tls.server.need.client.auth``
(none / optional / require), ``tls.enable`` (clients use TLS), ``tls.client.certPath``,
``tls.client.keyPath``, ``tls.client.keyPassword``, ``tls.client.trustCertPath``,
``tls.client.authServer``.  Where RocketMQ's defaults are insecure, rmqha's are not, and a
mode without certificate paths is an error rather than a self-signed "test mode":

- the default mode is ``disabled`` (RocketMQ: ``permissive`` with a throwaway certificate);
- ``tls.client.authServer`` defaults to true (RocketMQ: false, trusting any server);
- ``tls.test.mode.enable=true`` is refused (there is no test mode);
- a server that asks for client certificates always checks them against
  ``tls.server.trustCertPath`` (RocketMQ checks only with ``tls.server.authClient=true``).

Peer names come from certificates, not host names: a client does not match the server's
certificate against the address it dialled; it reads the ``rmqha:`` SAN URI with
:func:`peer_identity` and decides (:func:`require_peer`).  Contexts are TLS 1.2+.
:class:`ReloadingContext` rebuilds a context when its files change, for new connections.
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import re
import socket
import ssl
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rmqha.errors import AuthenticationError, ConfigError
from rmqha.security.identity import Identity, Role, authorize, identity_from_uris

log = logging.getLogger(__name__)

TLS_HANDSHAKE_BYTE = 0x16


class TlsMode(enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.Enum):
    """``tls.server.need.client.auth``."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


_VERIFY = {ClientAuth.NONE: ssl.CERT_NONE, ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
           ClientAuth.REQUIRE: ssl.CERT_REQUIRED}

_KEYS: dict[str, str] = {
    "tls.server.mode": "server_mode",
    "tls.server.certPath": "server_cert_path",
    "tls.server.keyPath": "server_key_path",
    "tls.server.keyPassword": "server_key_password",
    "tls.server.trustCertPath": "server_trust_cert_path",
    "tls.server.need.client.auth": "server_need_client_auth",
    "tls.server.authClient": "server_auth_client",
    "tls.enable": "client_enable",
    "tls.client.certPath": "client_cert_path",
    "tls.client.keyPath": "client_key_path",
    "tls.client.keyPassword": "client_key_password",
    "tls.client.trustCertPath": "client_trust_cert_path",
    "tls.client.authServer": "client_auth_server",
    "tls.test.mode.enable": "test_mode",
}


def _bool(key: str, value: str, source: str) -> bool:
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise ConfigError(f"{key}={value!r} in {source}: expected true or false")
    return word == "true"


def _enum(cls: type[enum.Enum], key: str, value: str, source: str) -> Any:
    try:
        return cls(value.strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise ConfigError(f"{key}={value!r} in {source}: expected one of {allowed}") from None


@dataclass(frozen=True)
class TlsSettings:
    """Both sides' TLS settings of one process (paths as given, checked when used)."""

    server_mode: TlsMode = TlsMode.DISABLED
    server_cert_path: str = ""
    server_key_path: str = ""
    server_key_password: str = dataclasses.field(default="", repr=False)
    server_trust_cert_path: str = ""
    server_need_client_auth: ClientAuth = ClientAuth.NONE
    client_enable: bool = False
    client_cert_path: str = ""
    client_key_path: str = ""
    client_key_password: str = dataclasses.field(default="", repr=False)
    client_trust_cert_path: str = ""
    client_auth_server: bool = True

    @classmethod
    def from_properties(cls, props: Mapping[str, str], source: str = "configuration") -> TlsSettings:
        """Settings from RocketMQ's ``tls.*`` keys; other keys are ignored, an unknown
        ``tls.`` key is an error naming it (a typo would otherwise turn TLS off)."""
        values: dict[str, Any] = {}
        for key, value in props.items():
            if not key.startswith("tls."):
                continue
            attr = _KEYS.get(key)
            if attr is None:
                raise ConfigError(f"unknown TLS key {key!r} in {source} (known: {', '.join(_KEYS)})")
            values[attr] = _convert(key, attr, str(value), source)
        if values.pop("test_mode", False):
            raise ConfigError(f"tls.test.mode.enable=true in {source}: rmqha has no TLS test mode; "
                              "give certificates (make them with `rmqha certs`)")
        values.pop("server_auth_client", None)  # accepted for RocketMQ files; always on here
        return cls(**values)

    @classmethod
    def from_config(cls, config: object, source: str = "configuration") -> TlsSettings:
        """Settings from a process's config dataclass: each key's field (see
        :func:`config_field`) where the dataclass has one, then the ``tls.*`` keys of
        ``tls_config_file`` (RocketMQ's ``tls.config.file``; its values win, as there)."""
        props = {key: _as_text(getattr(config, config_field(key)))
                 for key in _KEYS if hasattr(config, config_field(key))}
        tls_file = str(getattr(config, "tls_config_file", "") or "")
        if tls_file:
            props.update(read_tls_file(tls_file))
            source = f"{source} and {tls_file}"
        return cls.from_properties(props, source)

    @property
    def serves_tls(self) -> bool:
        """Whether a server with these settings takes TLS connections at all."""
        return self.server_mode is not TlsMode.DISABLED

    def for_identity_files(self, cert: str, key: str, ca: str) -> TlsSettings:
        """These settings with one process's certificate pair and CA on both sides."""
        return dataclasses.replace(self, server_cert_path=cert, server_key_path=key,
                                 server_trust_cert_path=ca, client_cert_path=cert,
                                 client_key_path=key, client_trust_cert_path=ca)

    def for_internal_link(self) -> TlsSettings:
        """These settings for a link between peers of one cluster (the brokers' HA port):
        both ends use this server's certificate pair, key password and CA, the server
        always requires a client certificate and the client always checks the server's
        (``tls.server.need.client.auth`` and ``tls.client.*`` are the client port's).
        ConfigError when ``tls.server.trustCertPath`` is not set."""
        ca = _need(self.server_trust_cert_path, "tls.server.trustCertPath (the HA port's mutual TLS)")
        both = self.for_identity_files(self.server_cert_path, self.server_key_path, ca)
        return dataclasses.replace(both, server_need_client_auth=ClientAuth.REQUIRE, client_auth_server=True,
                                   client_key_password=self.server_key_password)


_CAPITAL = re.compile(r"([A-Z])")


def config_field(key: str) -> str:
    """The config dataclass field a ``tls.*`` key sets: ``tls.server.certPath`` ->
    ``tls_server_cert_path``, ``tls.enable`` -> ``tls_enable``."""
    return _CAPITAL.sub(r"_\1", key).lower().replace(".", "_")


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def read_tls_file(path: str | Path) -> dict[str, str]:
    """The ``key=value`` lines of a RocketMQ ``tls.properties`` file (``#``/``!``
    comments); ConfigError naming the file when it cannot be read or a line is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tls.config.file={path} cannot be read: {exc}") from None
    props: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {stripped!r}")
        props[key.strip()] = value.strip()
    return props


def _convert(key: str, attr: str, value: str, source: str) -> Any:
    if attr == "server_mode":
        return _enum(TlsMode, key, value, source)
    if attr == "server_need_client_auth":
        return _enum(ClientAuth, key, value or "none", source)
    if attr in ("client_enable", "client_auth_server", "server_auth_client", "test_mode"):
        return _bool(key, value, source)
    return value.strip()


def _need(path: str, key: str) -> str:
    if not path:
        raise ConfigError(f"{key} is not set; TLS needs it here")
    return path


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, password: str, side: str) -> None:
    try:
        ctx.load_cert_chain(cert, key, password or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls.{side}.certPath={cert} / tls.{side}.keyPath={key} cannot be "
                          f"loaded: {exc}") from None


def _load_trust(ctx: ssl.SSLContext, path: str, key: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key}={path} cannot be loaded: {exc}") from None


def server_context(s: TlsSettings) -> ssl.SSLContext:
    """The server side's context: its certificate, and client certificates checked against
    ``tls.server.trustCertPath`` as ``tls.server.need.client.auth`` asks."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, _need(s.server_cert_path, "tls.server.certPath"),
                _need(s.server_key_path, "tls.server.keyPath"), s.server_key_password, "server")
    ctx.verify_mode = _VERIFY[s.server_need_client_auth]
    if s.server_need_client_auth is not ClientAuth.NONE:
        _load_trust(ctx, _need(s.server_trust_cert_path, "tls.server.trustCertPath"),
                    "tls.server.trustCertPath")
    return ctx


def client_context(s: TlsSettings) -> ssl.SSLContext:
    """The client side's context: servers checked against ``tls.client.trustCertPath``
    (unless ``tls.client.authServer=false``), its own certificate sent when configured."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # the peer is named by its rmqha: URI, not by host name
    if s.client_auth_server:
        _load_trust(ctx, _need(s.client_trust_cert_path, "tls.client.trustCertPath"),
                    "tls.client.trustCertPath")
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if s.client_cert_path or s.client_key_path:
        _load_chain(ctx, _need(s.client_cert_path, "tls.client.certPath"),
                    _need(s.client_key_path, "tls.client.keyPath"), s.client_key_password, "client")
    return ctx


# --- reload ------------------------------------------------------------------------------


FileStamp = tuple[int, int, int] | None


def _stamp(path: Path) -> FileStamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class ReloadingContext:
    """An SSLContext rebuilt when one of its files changes (mtime, size or inode).

    :meth:`get` costs at most one ``stat`` per file every ``recheck_interval_s``; give its
    result to each new connection.  A rebuild that fails (say, a key written after its
    certificate) keeps the previous context, logs why, and is tried again on the next
    change.
    """

    def __init__(self, build: Callable[[], ssl.SSLContext], paths: Sequence[str | Path],
                 recheck_interval_s: float = 1.0) -> None:
        self._build = build
        self.paths = [Path(p) for p in paths if p]
        self.recheck_interval_s = recheck_interval_s
        self._stamps = self._read_stamps()
        self._context = build()
        self._next_check = time.monotonic() + recheck_interval_s
        self.generation = 0

    @classmethod
    def server(cls, s: TlsSettings, recheck_interval_s: float = 1.0) -> ReloadingContext:
        paths = [s.server_cert_path, s.server_key_path, s.server_trust_cert_path]
        return cls(lambda: server_context(s), paths, recheck_interval_s)

    @classmethod
    def client(cls, s: TlsSettings, recheck_interval_s: float = 1.0) -> ReloadingContext:
        paths = [s.client_cert_path, s.client_key_path, s.client_trust_cert_path]
        return cls(lambda: client_context(s), paths, recheck_interval_s)

    def _read_stamps(self) -> list[FileStamp]:
        return [_stamp(p) for p in self.paths]

    def reload_if_changed(self) -> bool:
        """Rebuild now if a file changed; whether the context was replaced."""
        stamps = self._read_stamps()
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            self._context = self._build()
        except ConfigError as exc:
            log.error("TLS files changed but the new context cannot be built; keeping the "
                      "previous one: %s", exc)
            return False
        self.generation += 1
        log.info("TLS context rebuilt from %s", ", ".join(map(str, self.paths)))
        return True

    def get(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.recheck_interval_s
            self.reload_if_changed()
        return self._context


# --- one port, both kinds --------------------------------------------------------------


class ConnectionKind(enum.Enum):
    TLS = "tls"
    PLAINTEXT = "plaintext"


def classify_first_byte(first: bytes, mode: TlsMode) -> ConnectionKind:
    """What a connection that opened with ``first`` is, and whether ``mode`` takes it
    (AuthenticationError when not, as RocketMQ's ``TlsModeHandler`` closes it)."""
    if not first:
        raise AuthenticationError("the peer closed the connection before sending anything")
    is_tls = first[0] == TLS_HANDSHAKE_BYTE
    if is_tls and mode is TlsMode.DISABLED:
        raise AuthenticationError("a TLS handshake arrived, but TLS is disabled on this port")
    if not is_tls and mode is TlsMode.ENFORCING:
        raise AuthenticationError("a plaintext connection arrived, but this port enforces TLS")
    return ConnectionKind.TLS if is_tls else ConnectionKind.PLAINTEXT


def _set_ready(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def peek_first_byte(sock: socket.socket, timeout: float) -> bytes:
    """The first byte waiting on a non-blocking accepted socket, left unread (so the socket
    can be handed to ``loop.connect_accepted_socket`` with or without ``ssl``); b"" when
    the peer closed.  TimeoutError after ``timeout`` seconds without a byte."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(sock.fileno(), _set_ready, ready)
        try:
            await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
        finally:
            loop.remove_reader(sock.fileno())


async def accepted_kind(sock: socket.socket, mode: TlsMode, timeout: float = 10.0) -> ConnectionKind:
    """How to serve a newly accepted socket under ``mode``, by its first byte (see
    :func:`classify_first_byte`; DISABLED peeks too, to close a TLS client at once)."""
    sock.setblocking(False)
    return classify_first_byte(await peek_first_byte(sock, timeout), mode)


async def accept_connection(sock: socket.socket, protocol_factory: Callable[[], asyncio.BaseProtocol],
                            mode: TlsMode, context: ReloadingContext | None, *,
                            timeout: float = 10.0) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """Serve an accepted socket (from ``loop.sock_accept``) under ``mode``: plaintext, or
    TLS with the current context (so a reloaded certificate serves the next connection).
    AuthenticationError (socket closed) when the mode refuses it; ``ssl.SSLError`` /
    ``ConnectionError`` when the TLS handshake fails."""
    try:
        kind = await accepted_kind(sock, mode, timeout)
        if kind is ConnectionKind.TLS and context is None:
            raise AuthenticationError("a TLS handshake arrived, but this port has no TLS context")
        ssl_context = context.get() if kind is ConnectionKind.TLS and context else None
        loop = asyncio.get_running_loop()
        return await loop.connect_accepted_socket(
            protocol_factory, sock, ssl=ssl_context,
            ssl_handshake_timeout=timeout if ssl_context else None)
    except BaseException:
        sock.close()
        raise


# --- who is on the other end -------------------------------------------------------------


def peer_identity(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> Identity:
    """The identity in the peer's *verified* certificate (AuthenticationError when the
    peer sent none, it was not verified, or it names no single rmqha identity).  With
    asyncio: ``transport.get_extra_info("ssl_object")``."""
    cert = ssl_object.getpeercert()
    if not cert:
        raise AuthenticationError("the TLS peer presented no verified certificate")
    san = cast("tuple[tuple[str, str], ...]", cert.get("subjectAltName", ()))
    uris = tuple(value for kind, value in san if kind == "URI")
    try:
        return identity_from_uris(uris, "the TLS peer's certificate")
    except ConfigError as exc:
        raise AuthenticationError(str(exc)) from None


def verified_identity(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Identity | None:
    """:func:`peer_identity`, or None for a plaintext connection, a peer without a
    verified certificate or a certificate that names no single rmqha identity (an
    application's certificate from the same CA, say)."""
    if ssl_object is None:
        return None
    try:
        return peer_identity(ssl_object)
    except AuthenticationError as exc:
        log.debug("TLS peer without an rmqha identity: %s", exc)
        return None


def require_peer(ssl_object: ssl.SSLObject | ssl.SSLSocket, *,
                 roles: Collection[Role] | None = None, expected: Identity | None = None,
                 cluster: str | None = None, group: str | None = None) -> Identity:
    """The peer's identity if :func:`~rmqha.security.identity.authorize` lets it in
    (PeerIdentityError naming both otherwise)."""
    return authorize(peer_identity(ssl_object), roles=roles, expected=expected,
                     cluster=cluster, group=group)
