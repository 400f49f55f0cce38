"""RocketMQ ACL 1.0: ``plain_acl.yml``, the permission each request needs, and the check.

File format (RocketMQ's ``distribution/conf/plain_acl.yml``)::

    globalWhiteRemoteAddresses: [10.10.103.*]     # these addresses skip every check
    accounts:
      - accessKey: RocketMQ                        # > 6 characters
        secretKey: 12345678                        # > 6 characters
        whiteRemoteAddress: 192.168.0.*            # these addresses skip this account's checks
        admin: false
        defaultTopicPerm: DENY                     # DENY | PUB | SUB | PUB|SUB (missing: DENY)
        defaultGroupPerm: SUB
        topicPerms: [topicA=DENY, topicB=PUB|SUB]
        groupPerms: [groupA=SUB]

Every scalar is read as the text written (``secretKey: 0123`` is the string ``0123``, as
RocketMQ's typed loader reads it).  Unlike RocketMQ, a file with an unknown key, a bad
permission word, a repeated accessKey or a bad address pattern is refused as a whole with
an error naming the entry; :class:`AclValidator` then keeps the accounts it had.

The check (``PlainPermissionManager.validate`` + ``PlainPermissionChecker.check``), in order:

1. a remote address in ``globalWhiteRemoteAddresses`` passes;
2. no ``AccessKey`` field, or one no account has: refused;
3. a remote address in the account's ``whiteRemoteAddress`` passes (no signature check);
4. a wrong ``Signature``: refused;
5. a send to ``RMQ_SYS_TRACE_TOPIC`` passes;
6. an admin account passes; a code without a declaration in
   :data:`rmqha.protocol.code_rules.RULES`, or one no application may send, is refused;
7. each resource the request names needs its permission (the topic's or group's own entry,
   else the default; a group is checked as its retry topic ``%RETRY%<group>``).

What a code names and needs is its declaration's (:mod:`rmqha.protocol.code_rules`, the one
place that decides it): this module only reads the names out and compares perms.  A topic
``%RETRY%<group>`` or ``%DLQ%<group>`` is the group's resource, so a send into another
group's retry topic needs that group's SUB; a pop retry topic ``%RETRY%<group>_<topic>``
of the request's own group counts as ``<topic>``.  Resources found only in stored data
(the record at a commitlog offset) or in the answer (listings) are the handler's to check,
through :meth:`AclValidator.allows`.  RocketMQ's remoting ACL 1.0 names no resource for
the pop codes, checks any signed account's reads of offsets and records by id not at all,
and keeps five codes for admins (:data:`ROCKETMQ_ADMIN_CODES`); rmqha checks all of them.

RocketMQ's broker answers every refusal with SYSTEM_ERROR (1); the raised
:class:`~rmqha.errors.AclError` carries that code and the remark.
"""
from __future__ import annotations

import enum
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqha.errors import (
    AclAuthenticationError,
    AclError,
    AclPermissionError,
    ConfigError,
    ProtocolError,
)
from rmqha.protocol.code_rules import RULES, CodeRule, Kind, Named, Need, resources_of, rule_of, topic_resource
from rmqha.protocol.codes import RequestCode
from rmqha.security.address_pattern import AddressPattern, parse_ip
from rmqha.security.replay import ReplayWindow
from rmqha.security.signature import ACCESS_KEY, SIGNATURE, signature_matches

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
MIN_KEY_LENGTH = 7  # RocketMQ refuses keys of 6 characters or fewer


class Perm(enum.IntFlag):
    """``org.apache.rocketmq.acl.common.Permission`` bits."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


def perm_allows(needed: Perm, owned: Perm) -> bool:
    """``Permission.checkPermission``: DENY wins; ANY needs PUB or SUB; else a shared bit."""
    owned_bits, needed_bits = int(owned), int(needed)  # plain ints: no Flag objects per check
    if owned_bits & Perm.DENY:
        return False
    if needed_bits & Perm.ANY:
        return bool(owned_bits & (Perm.PUB | Perm.SUB))
    return bool(needed_bits & owned_bits)


_PERM_WORDS: dict[str, Perm] = {
    "DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB, "SUB|PUB": Perm.PUB | Perm.SUB,
}


#: RocketMQ's ``Permission.ADMIN_CODE`` (for comparison: rmqha keeps every code of
#: :data:`rmqha.protocol.code_rules.ADMIN_ONLY_CODES` for admins, a superset).
ROCKETMQ_ADMIN_CODES: frozenset[int] = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG, RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
})
_NEED_PERM = {Need.PUB: Perm.PUB, Need.SUB: Perm.SUB, Need.ANY: Perm.ANY}


# --- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """One ``accounts`` entry; ``perms`` maps a topic, or a group's retry topic, to its perm."""

    access_key: str
    secret_key: str = field(repr=False)
    white_address: AddressPattern
    admin: bool
    default_topic_perm: Perm
    default_group_perm: Perm
    perms: Mapping[str, Perm]

    def owned(self, resource: str) -> tuple[Perm, bool]:
        """The perm this account has on ``resource`` and whether it is the default."""
        if resource in self.perms:
            return self.perms[resource], False
        is_group = resource.startswith(RETRY_PREFIX)
        return (self.default_group_perm if is_group else self.default_topic_perm), True


@dataclass(frozen=True)
class AclConfig:
    """A parsed ``plain_acl.yml``."""

    global_white: tuple[AddressPattern, ...]
    accounts: Mapping[str, Account]

    @classmethod
    def parse(cls, text: str, source: str = "plain_acl.yml") -> AclConfig:
        """The config in ``text``; ConfigError naming ``source`` and the bad entry."""
        data = _load_yaml(text, source)
        return _build_config(data, source)


_TOP_KEYS = {"globalWhiteRemoteAddresses", "accounts", "dataVersion"}
_ACCOUNT_KEYS = {"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                 "defaultGroupPerm", "topicPerms", "groupPerms"}
_TRUE = {"true", "yes", "on"}
_FALSE = {"false", "no", "off", ""}


def _load_yaml(text: str, source: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise ConfigError(f"reading {source} needs PyYAML (pip install pyyaml)") from None
    try:
        # BaseLoader keeps every scalar as the text written, like RocketMQ's typed loader.
        return yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None


def _build_config(data: Any, source: str) -> AclConfig:
    if data is None or data == "":
        return AclConfig((), {})
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    _no_unknown_keys(data, _TOP_KEYS, source)
    white = tuple(_pattern(p, f"{source}: globalWhiteRemoteAddresses[{i}]")
                  for i, p in enumerate(_str_list(data.get("globalWhiteRemoteAddresses"),
                                                  f"{source}: globalWhiteRemoteAddresses")))
    raw_accounts = data.get("accounts") or []
    if not isinstance(raw_accounts, list):
        raise ConfigError(f"{source}: accounts must be a list")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _build_account(raw, f"{source}: accounts[{i}]")
        if account.access_key in accounts:
            raise ConfigError(f"{source}: accounts[{i}] repeats accessKey {account.access_key!r}")
        accounts[account.access_key] = account
    return AclConfig(white, accounts)


def _no_unknown_keys(data: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(sorted(known))})")


def _str_list(value: Any, where: str) -> list[str]:
    if value is None or value == "":
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return value


def _pattern(text: str, where: str) -> AddressPattern:
    try:
        return AddressPattern.parse(text)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _build_account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with accessKey, secretKey, ...")
    access_key = _key(raw, "accessKey", where)
    where = f"{where} (accessKey {access_key!r})"
    _no_unknown_keys(raw, _ACCOUNT_KEYS, where)
    perms = _resource_perms(raw.get("topicPerms"), f"{where}: topicPerms", group=False)
    perms.update(_resource_perms(raw.get("groupPerms"), f"{where}: groupPerms", group=True))
    return Account(
        access_key=access_key,
        secret_key=_key(raw, "secretKey", where),
        white_address=_pattern(_scalar(raw, "whiteRemoteAddress", where), f"{where}: whiteRemoteAddress"),
        admin=_bool(_scalar(raw, "admin", where), f"{where}: admin"),
        default_topic_perm=_perm(raw.get("defaultTopicPerm"), f"{where}: defaultTopicPerm"),
        default_group_perm=_perm(raw.get("defaultGroupPerm"), f"{where}: defaultGroupPerm"),
        perms=perms,
    )


def _scalar(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a single value")
    return value.strip()


def _key(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = _scalar(raw, key, where)
    if len(value) < MIN_KEY_LENGTH:
        # The value itself is not shown: it may be a secret.
        raise ConfigError(f"{where}: {key} must have at least {MIN_KEY_LENGTH} characters "
                          f"(has {len(value)})")
    return value


def _bool(text: str, where: str) -> bool:
    word = text.lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ConfigError(f"{where}: {text!r} is not true or false")


def _perm(value: Any, where: str) -> Perm:
    if value is None or value == "":
        return Perm.DENY  # RocketMQ's default for a missing default perm
    if not isinstance(value, str) or value.strip() not in _PERM_WORDS:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(_PERM_WORDS)}")
    return _PERM_WORDS[value.strip()]


def _resource_perms(value: Any, where: str, *, group: bool) -> dict[str, Perm]:
    perms: dict[str, Perm] = {}
    for i, entry in enumerate(_str_list(value, where)):
        name, sep, word = entry.partition("=")
        if not sep or not name.strip() or "=" in word:
            raise ConfigError(f"{where}[{i}]: {entry!r} is not name=PERM (e.g. topicA=PUB|SUB)")
        key = (RETRY_PREFIX if group else "") + name.strip()
        perms[key] = _perm(word, f"{where}[{i}] ({entry!r})")
    return perms


# --- what a request needs ----------------------------------------------------------------


@dataclass(frozen=True)
class RequiredAccess:
    """What one request asks for: a perm on each resource (topic, or ``%RETRY%group``)."""

    code: int
    resources: Mapping[str, Perm]


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def describe_resource(resource: str) -> str:
    """``group:G`` for a retry topic, ``topic:T`` otherwise (RocketMQ's ``printStr``)."""
    if resource.startswith(RETRY_PREFIX):
        return f"group:{resource[len(RETRY_PREFIX):]}"
    return f"topic:{resource}"


def resource_key(named: Named) -> str:
    """The key of ``named`` in an account's perms: a topic's name, a group's retry topic."""
    return retry_topic(named.name) if named.kind == Kind.GROUP else named.name


def required_access(code: int, ext_fields: Mapping[str, str], body: bytes | None,
                    rules: Mapping[RequestCode, CodeRule] = RULES) -> RequiredAccess:
    """The resources a request names, as its declaration in ``rules`` finds them (a
    resource named twice keeps its last perm, like RocketMQ's map).  An empty group names
    no resource: the C++ client unregisters a producer with ``consumerGroup=""``, which
    RocketMQ checks as group "" and refuses under ``defaultGroupPerm: DENY``.  A code
    without a declaration is refused."""
    if rule_of(code, rules) is None:
        raise AclPermissionError(f"request code {code} has no declaration in rmqha.protocol.code_rules: refused")
    try:
        named = resources_of(code, ext_fields, body, rules)
    except ProtocolError as exc:
        raise AclError(f"request code {code}: {exc} (read for the ACL check)") from None
    return RequiredAccess(code, {resource_key(n): _NEED_PERM[n.need] for n in named})


# --- the check ---------------------------------------------------------------------------


def check_request(config: AclConfig, code: int, ext_fields: Mapping[str, str], body: bytes | None,
                  remote_ip: str, *, version: int | None = None,
                  rules: Mapping[RequestCode, CodeRule] = RULES, replay: ReplayWindow | None = None) -> None:
    """Raise an :class:`~rmqha.errors.AclError` unless ``config`` lets this request through
    (and ``replay``, given, takes its signed time and signature: :mod:`rmqha.security.replay`)."""
    ip = parse_ip(remote_ip)
    if any(p.matches_ip(ip) for p in config.global_white):
        return
    access_key = ext_fields.get(ACCESS_KEY)
    if access_key is None:
        raise AclAuthenticationError(f"request code {code} from {remote_ip} carries no AccessKey")
    account = config.accounts.get(access_key)
    if account is None:
        raise AclAuthenticationError(f"no ACL account for accessKey={access_key}")
    if account.white_address.matches_ip(ip):
        return
    if SIGNATURE not in ext_fields:
        raise AclAuthenticationError(f"request code {code} for accessKey={access_key} carries no Signature")
    if not signature_matches(ext_fields, body, account.secret_key, version):
        raise AclAuthenticationError(f"check signature failed for accessKey={access_key}")
    _check_permissions(account, required_access(code, ext_fields, body, rules), rules)
    if replay is not None:  # last: a refused request leaves no signature in the cache
        replay.check_fields(ext_fields, ext_fields[SIGNATURE].encode("utf-8", "replace"), code)


def _check_permissions(account: Account, need: RequiredAccess, rules: Mapping[RequestCode, CodeRule]) -> None:
    if need.resources.get(TRACE_TOPIC) == Perm.PUB or account.admin:
        return
    rule = rule_of(need.code, rules)
    if rule is None or rule.admin_only:
        raise AclPermissionError(f"request code {need.code} needs an admin account, and "
                                 f"accessKey={account.access_key} is not one")
    for resource, perm in need.resources.items():
        owned, default = account.owned(resource)
        if not perm_allows(perm, owned):
            which = "default permission" if default else "permission"
            raise AclPermissionError(
                f"accessKey={account.access_key} has no {perm.name} {which} for "
                f"{describe_resource(resource)} (it has {owned.name})")


FileStamp = tuple[int, int, int]


def _stamp(path: Path) -> FileStamp | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class AclValidator:
    """The ACL of one ``plain_acl.yml``, re-read when the file changes.

    ``check`` costs at most one ``stat`` every ``recheck_interval_s`` seconds (0 = every
    call) besides the check itself.  A changed file that does not parse leaves the accounts
    as they were and logs why, once per version of the file.
    """

    def __init__(self, path: str | Path, *, recheck_interval_s: float = 1.0,
                 rules: Mapping[RequestCode, CodeRule] = RULES, replay: ReplayWindow | None = None) -> None:
        self.path = Path(path)
        #: The replay window every verified signature passes (None: none, RocketMQ's way).
        self.replay = replay
        self.recheck_interval_s = recheck_interval_s
        #: The code declarations it decides by (a test hands a wrong one to its negative control).
        self.rules = rules
        stamp = _stamp(self.path)
        if stamp is None:
            raise ConfigError(f"ACL file {self.path} does not exist or cannot be read")
        self.config = self._read()
        self._stamp: FileStamp | None = stamp
        self._next_check = time.monotonic() + recheck_interval_s

    def _read(self) -> AclConfig:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read ACL file {self.path}: {exc}") from None
        return AclConfig.parse(text, str(self.path))

    def reload_if_changed(self) -> bool:
        """Re-read the file if its mtime, size or inode changed; whether the accounts changed."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        if stamp is None:
            log.warning("ACL file %s is gone; keeping the %d account(s) loaded before",
                        self.path, len(self.config.accounts))
            return False
        try:
            self.config = self._read()
        except ConfigError as exc:
            log.error("ACL file %s changed but is refused, keeping the %d account(s) loaded "
                      "before: %s", self.path, len(self.config.accounts), exc)
            return False
        log.info("ACL file %s reloaded: %d account(s), %d global white address pattern(s)",
                 self.path, len(self.config.accounts), len(self.config.global_white))
        return True

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.recheck_interval_s
            self.reload_if_changed()

    def current(self) -> AclConfig:
        """The config in force (the file re-read first if it is time to look)."""
        self._maybe_reload()
        return self.config

    def check(self, code: int, ext_fields: Mapping[str, str], body: bytes | None,
              remote_ip: str, version: int | None = None) -> None:
        """Refuse (raise :class:`~rmqha.errors.AclError`) or let through one request.

        ``remote_ip`` is the peer's address without port; ``version`` the frame's
        ``version`` field (old clients signed without ``_UNIQUE_KEY_QUERY``).
        """
        self._maybe_reload()
        check_request(self.config, code, ext_fields, body, remote_ip, version=version,
                      rules=self.rules, replay=self.replay)

    def allows(self, ext_fields: Mapping[str, str], remote_ip: str, named: Named) -> bool:
        """Whether the account of a request :meth:`check` let through may see ``named``,
        a resource its handler found in stored data (a record's topic, a listed entry)."""
        config = self.current()
        ip = parse_ip(remote_ip)
        if any(p.matches_ip(ip) for p in config.global_white):
            return True
        account = config.accounts.get(ext_fields.get(ACCESS_KEY, ""))
        if account is None:
            return False
        if account.admin or account.white_address.matches_ip(ip):
            return True
        if named.kind == Kind.TOPIC:
            named = topic_resource(named.name, named.need)
        owned, _ = account.owned(resource_key(named))
        return perm_allows(_NEED_PERM[named.need], owned)
