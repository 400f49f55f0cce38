"""What a client adds to its connections: TLS, and RocketMQ ACL 1.0 credentials.

:class:`ClientSecurity` is handed to :class:`~rmqha.net.client.RemotingClient` (and on
through ``ClientSession``, ``Producer``, ``Consumer`` ...):

- ``ssl_context``: connections are made over TLS with it (a
  :class:`~rmqha.security.tls.ReloadingContext` gives each new connection the files as
  they are now, so a renewed client certificate is used from the next connection on);
- ``channel``: a :class:`~rmqha.security.channel_auth.ChannelKey`: each new connection is
  an authenticated channel (:mod:`rmqha.net.channel`), proved by the cluster secret, and
  every answer must carry its MAC (a cluster process's control links);
- ``rpc_hook``: called with every outgoing request just before it is written (RocketMQ's
  ``RPCHook.doBeforeRequest``); :meth:`Credentials.sign` is the one rmqha has, adding
  ``AccessKey``, the replay stamp (``RmqhaTime`` and ``RmqhaNonce``,
  :mod:`rmqha.security.replay`: brokers refuse the request after 5 minutes or a second
  time) and the ``Signature`` over the final ext fields and body;
- ``credentials``: those :class:`Credentials` themselves, when the hook is theirs, so that
  a send encoded in one compiled call is signed as it is
  (:meth:`Credentials.sign_send_frame`) instead of being built again as a command.

:meth:`ClientSecurity.from_options` turns an application's arguments into one: credentials
given, else ``RMQHA_ACCESS_KEY`` / ``RMQHA_SECRET_KEY`` from the environment, and ``tls``
as ``True`` (the system's CA store, the host name checked), a CA file's path (a cluster
CA made with ``rmqha certs``: the server's certificate is checked against it, not against
the host name, since brokers move between addresses), :class:`TlsSettings` (a client
certificate too, for servers that require one) or a ready ``ssl.SSLContext``.
"""
from __future__ import annotations

import functools
import os
import ssl
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rmqha.errors import ConfigError, ServerIdentityError
from rmqha.protocol.command import RemotingCommand
from rmqha.security.channel_auth import ChannelKey
from rmqha.security.identity import Identity, Role
from rmqha.security.replay import NONCE_FIELD, TIME_FIELD, stamp
from rmqha.security.signature import ACCESS_KEY, mac_for, sign, signed_fields_plus
from rmqha.security.tls import ReloadingContext, TlsSettings

ENV_ACCESS_KEY = "RMQHA_ACCESS_KEY"
ENV_SECRET_KEY = "RMQHA_SECRET_KEY"

_EXT_START = b'"extFields":{'
_LENGTHS = struct.Struct(">iI")

#: ``hook(request)``: may change the request's ext fields in place before it is written.
RpcHook = Callable[[RemotingCommand], None]

#: What a client's ``tls`` argument may be (see the module docstring).
TlsOption = bool | str | Path | TlsSettings | ssl.SSLContext | ReloadingContext | None

ContextSource = ssl.SSLContext | ReloadingContext


@dataclass(frozen=True)
class Credentials:
    """An account of the brokers' ``plain_acl.yml``; the secret never shows in a repr."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)
    #: The replay stamp added to each request (time and nonce; a test fixes it).
    stamper: Callable[[], dict[str, str]] = field(default=stamp, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ConfigError("credentials need both an access key and a secret key")

    @classmethod
    def resolve(cls, access_key: str | None = None, secret_key: str | None = None,
                env: Mapping[str, str] | None = None) -> Credentials | None:
        """The credentials given, else those of the environment; None when neither has
        any.  ConfigError when only one half is there (a send would be refused anyway,
        and later, with a less clear reason)."""
        environ = os.environ if env is None else env
        ak = access_key or environ.get(ENV_ACCESS_KEY, "")
        sk = secret_key or environ.get(ENV_SECRET_KEY, "")
        if not ak and not sk:
            return None
        if not ak or not sk:
            given, missing = ("an access key", "secret key") if ak else ("a secret key", "access key")
            raise ConfigError(f"{given} was given without the {missing} (argument, or "
                              f"${ENV_ACCESS_KEY} / ${ENV_SECRET_KEY})")
        return cls(ak, sk)

    def sign(self, cmd: RemotingCommand) -> None:
        """An :data:`RpcHook`: sign ``cmd`` the RocketMQ ACL 1.0 way."""
        cmd.ext_fields = sign(cmd.ext_fields, cmd.body, self.access_key, self.secret_key,
                              self.security_token, self.stamper())

    def sign_send_frame(self, frame: bytes, ext_fields: Mapping[str, str],
                        body: bytes) -> bytes | None:
        """``frame`` (a whole JSON-header frame whose extFields are ``ext_fields`` and
        whose body is ``body``, as the send codec writes it) with ``AccessKey`` and the
        ``Signature`` :meth:`sign` would add: what the broker reads from it is what it
        reads from the command :meth:`sign` signs.  None when this cannot be done in
        place (a security token, an access key JSON would escape, another header)."""
        ours = self._in_place
        if ours is None:
            return None
        stamped = self.stamper()
        total, ori = _LENGTHS.unpack_from(frame, 0)
        at = frame.find(_EXT_START, 8, 8 + (ori & 0xFFFFFF)) + len(_EXT_START)
        if ori >> 24 != 0 or at < len(_EXT_START) or frame[at:at + 1] != b'"' or ori > 0xFFF000:
            return None  # not JSON, no extFields entry to put ours before, or no room
        # The body hashed where it is, after the fields (no joined copy of a batch's body).
        signature = mac_for(self.secret_key).base64(
            signed_fields_plus(ext_fields, {ACCESS_KEY: self.access_key, **stamped}), body)
        ours = b'"%s":"%s","%s":"%s",%s%s",' % (
            NONCE_FIELD.encode(), stamped[NONCE_FIELD].encode(), TIME_FIELD.encode(),
            stamped[TIME_FIELD].encode(), ours, signature)
        return b"".join([_LENGTHS.pack(total + len(ours), ori + len(ours)), frame[8:at], ours,
                         frame[at:]])

    @functools.cached_property
    def _in_place(self) -> bytes | None:
        """What :meth:`sign_send_frame` puts before the signature's value; None when it
        cannot sign in place (a security token, an access key JSON would escape)."""
        key = self.access_key
        if self.security_token is not None or not (
                key.isascii() and key.isprintable() and '"' not in key and "\\" not in key):
            return None
        return b'"%s":"%s","Signature":"' % (ACCESS_KEY.encode(), key.encode())


def client_context(tls: TlsOption) -> ContextSource | None:
    """The context (or reloading context) a ``tls`` argument asks for; None for plaintext."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return ssl.create_default_context()  # the system's CAs, and host names checked
    if isinstance(tls, (ssl.SSLContext, ReloadingContext)):
        return tls
    if isinstance(tls, (str, Path)):
        tls = TlsSettings(client_enable=True, client_trust_cert_path=str(tls))
    if isinstance(tls, TlsSettings):
        return ReloadingContext.client(tls)
    raise ConfigError(f"tls={tls!r}: expected True, a CA file's path, TlsSettings or an SSLContext")


def current(source: ContextSource | None) -> ssl.SSLContext | None:
    """The context to give a new connection (a reloading one is checked for new files)."""
    return source.get() if isinstance(source, ReloadingContext) else source


@dataclass(frozen=True)
class ServerRole:
    """What a client dials a server as: a name server, a controller, or a broker (of
    ``cluster`` and ``group`` when the route names them).  Over TLS with a cluster CA the
    server's certificate must name it (:meth:`check`)."""

    role: Role
    cluster: str | None = None
    group: str | None = None

    @classmethod
    def namesrv(cls) -> ServerRole:
        return cls(Role.NAMESRV)

    @classmethod
    def controller(cls) -> ServerRole:
        return cls(Role.CONTROLLER)

    @classmethod
    def broker(cls, cluster: str | None = None, group: str | None = None) -> ServerRole:
        return cls(Role.BROKER, cluster or None, group or None)

    def describe(self) -> str:
        """As an operator writes the certificate's name."""
        if self.role is Role.BROKER:
            return f"rmqha:broker/{self.cluster or '<cluster>'}/{self.group or '<group>'}/<name>"
        return f"rmqha:{self.role.value}/<name>"

    def allows(self, peer: Identity | None) -> bool:
        return (peer is not None and peer.role is self.role
                and (self.cluster is None or peer.cluster == self.cluster)
                and (self.group is None or peer.group == self.group))

    def check(self, addr: str, peer: Identity | None) -> None:
        """ServerIdentityError naming the expected and the presented identity unless
        ``peer`` (the server certificate's identity, None: it names none) is one."""
        if not self.allows(peer):
            shown = str(peer) if peer is not None else "no rmqha identity"
            raise ServerIdentityError(
                f"{addr} was dialled as {self.describe()}, but its certificate names {shown}: "
                "refused before sending anything (a process serves only as the identity its "
                "certificate names)")


@dataclass(frozen=True)
class ClientSecurity:
    """TLS, the authenticated channel and the request hook of a client's connections
    (each optional)."""

    ssl_context: ContextSource | None = None
    rpc_hook: RpcHook | None = None
    channel: ChannelKey | None = None
    #: The credentials whose :meth:`Credentials.sign` is ``rpc_hook`` (None: another hook).
    credentials: Credentials | None = None
    #: Whether servers' certificates must name the role they are dialled as
    #: (:class:`ServerRole`): True when ``ssl_context`` trusts a cluster CA (a CA file,
    #: TlsSettings), whose certificates name rmqha identities; False for the system's CAs
    #: or a ready SSLContext, whose servers carry none.
    checks_roles: bool = False

    @property
    def frame_signer(self) -> Credentials | None:
        """The credentials that sign an encoded send in place as the hook would sign its
        command: only when the hook is their :meth:`Credentials.sign` (another hook needs
        the command)."""
        creds = self.credentials
        return creds if creds is not None and self.rpc_hook == creds.sign else None

    def with_channel(self, key: ChannelKey | None) -> ClientSecurity:
        """These settings, and connections made as authenticated channels with ``key``."""
        return ClientSecurity(self.ssl_context, self.rpc_hook, key, self.credentials, self.checks_roles)

    @classmethod
    def from_options(cls, *, access_key: str | None = None, secret_key: str | None = None,
                     tls: TlsOption = None, env: Mapping[str, str] | None = None
                     ) -> ClientSecurity | None:
        """An application's options (None when they ask for nothing)."""
        creds = Credentials.resolve(access_key, secret_key, env)
        context = client_context(tls)
        if creds is None and context is None:
            return None
        roles = (isinstance(tls, (str, Path, ReloadingContext))
                 or (isinstance(tls, TlsSettings) and tls.client_auth_server))
        if creds is None:
            return cls(context, checks_roles=roles)
        return cls(context, creds.sign, credentials=creds, checks_roles=roles)

    @classmethod
    def for_links(cls, settings: TlsSettings) -> ClientSecurity | None:
        """A cluster process's own outgoing links (to controllers, name servers and
        brokers): TLS with the ``tls.client.*`` files when ``tls.enable`` is on."""
        if not settings.client_enable:
            return None
        return cls(ReloadingContext.client(settings), checks_roles=settings.client_auth_server)
