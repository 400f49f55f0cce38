"""The remote-address patterns of RocketMQ's ``plain_acl.yml`` and how an address matches.

The forms RocketMQ's ``RemoteAddressStrategyFactory`` accepts, IPv4 and IPv6 alike:

- blank: matches nothing (an account without ``whiteRemoteAddress``)
- ``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*``: matches every address
- one address: ``192.168.1.1``, ``2001:db8::1`` (IPv6 compared in full form)
- a list: ``192.168.1.1,192.168.1.2``
- a set in the last group: ``192.168.1.{1,2,3}``, ``2001:db8::{1,2}``
- a range in one group, every later group ``*``: ``192.168.*.*``, ``192.168.1.1-100``,
  ``10.*.*.*``, ``2001:db8::5:600:300c:*``, ``2001:db8::ac5:78:1-200:*`` (IPv6 groups in hex)

RocketMQ silently treats anything after the ranged group as ``*`` (``192.*.1.*`` matches
``192.5.7.9``); here a fixed group after a range is refused with an error naming the
pattern, rather than matching more than it reads.  A remote address given as an
IPv4-mapped IPv6 address (``::ffff:10.0.0.1``, what a dual-stack socket reports) is matched
as the IPv4 address.
"""
from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from typing import Protocol

from rmqha.errors import ConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class _Matcher(Protocol):
    def matches(self, ip: IPAddress) -> bool: ...


@functools.lru_cache(maxsize=4096)
def parse_ip(text: str) -> IPAddress | None:
    """The address in ``text`` (brackets and an IPv6 zone dropped, IPv4-mapped IPv6 turned
    into IPv4), or None when it is not an IP address."""
    host = text.strip().strip("[]").partition("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _groups(ip: IPAddress) -> tuple[int, ...]:
    packed = ip.packed
    if ip.version == 4:
        return tuple(packed)
    return tuple(int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2))


@dataclass(frozen=True)
class _Everything:
    def matches(self, ip: IPAddress) -> bool:
        return True


@dataclass(frozen=True)
class _Nothing:
    def matches(self, ip: IPAddress) -> bool:
        return False


@dataclass(frozen=True)
class _OneOf:
    addresses: frozenset[IPAddress]

    def matches(self, ip: IPAddress) -> bool:
        return ip in self.addresses


@dataclass(frozen=True)
class _Range:
    """Groups before ``len(prefix)`` equal ``prefix``; that group in [lo, hi]; rest any."""

    version: int
    prefix: tuple[int, ...]
    lo: int
    hi: int

    def matches(self, ip: IPAddress) -> bool:
        if ip.version != self.version:
            return False
        groups = _groups(ip)
        n = len(self.prefix)
        return groups[:n] == self.prefix and self.lo <= groups[n] <= self.hi


@dataclass(frozen=True)
class AddressPattern:
    """One ``whiteRemoteAddress`` / ``globalWhiteRemoteAddresses`` entry."""

    text: str
    _matcher: _Matcher

    @classmethod
    def parse(cls, text: str | None) -> AddressPattern:
        """The pattern ``text`` (ConfigError naming it when RocketMQ would not take it)."""
        raw = (text or "").strip()
        return cls(raw, _parse(raw))

    def matches(self, remote_ip: str) -> bool:
        """Whether ``remote_ip`` (an address without port) falls in this pattern."""
        return self.matches_ip(parse_ip(remote_ip))

    def matches_ip(self, ip: IPAddress | None) -> bool:
        """:meth:`matches` for an address parsed once with :func:`parse_ip`."""
        return ip is not None and self._matcher.matches(ip)

    @property
    def matches_nothing(self) -> bool:
        return isinstance(self._matcher, _Nothing)


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(f"remote address pattern {text!r}: {why}")


def _one_ip(text: str, whole: str) -> IPAddress:
    ip = parse_ip(text)
    if ip is None or text.strip() != text.strip().strip("[]"):
        raise _bad(whole, f"{text.strip()!r} is not an IPv4 or IPv6 address")
    return ip


def _parse(text: str) -> _Matcher:
    if not text:
        return _Nothing()
    if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return _Everything()
    if text.endswith("}"):
        return _parse_braces(text)
    if "," in text:
        return _OneOf(frozenset(_one_ip(t, text) for t in text.split(",") if t.strip()))
    if "*" in text or "-" in text:
        return _parse_v6_range(text) if ":" in text else _parse_v4_range(text)
    return _OneOf(frozenset([_one_ip(text, text)]))


def _parse_braces(text: str) -> _Matcher:
    brace = text.rfind("{")
    head = text[:brace]
    if brace < 0 or not head.endswith((".", ":")):
        raise _bad(text, "a {a,b} set must be the whole last group, e.g. 192.168.1.{1,2}")
    items = [i.strip() for i in text[brace + 1:-1].split(",") if i.strip()]
    if not items:
        raise _bad(text, "the {} set is empty")
    return _OneOf(frozenset(_one_ip(head + i, text) for i in items))


def _range_bounds(group: str, text: str, base: int, top: int) -> tuple[int, int]:
    if group == "*":
        return 0, top
    lo_text, sep, hi_text = group.partition("-")
    try:
        lo, hi = int(lo_text, base), int(hi_text, base)
    except ValueError:
        raise _bad(text, f"group {group!r} is neither '*' nor a range like 1-100") from None
    if not sep or not (0 <= lo <= hi <= top):
        raise _bad(text, f"range {group!r} must be low-high within 0-{top:x}"
                   if base == 16 else f"range {group!r} must be low-high within 0-{top}")
    return lo, hi


def _parse_v4_range(text: str) -> _Matcher:
    parts = [p.strip() for p in text.split(".")]
    if len(parts) != 4:
        raise _bad(text, "an IPv4 pattern has 4 dot-separated groups")
    at = next(i for i, p in enumerate(parts) if p == "*" or "-" in p)
    if at == 0:
        raise _bad(text, "the first group cannot be a range (use '*' alone for every address)")
    if any(p != "*" for p in parts[at + 1:]):
        raise _bad(text, "every group after the ranged one must be '*'")
    prefix = []
    for p in parts[:at]:
        if not p.isdigit() or int(p) > 255:
            raise _bad(text, f"group {p!r} is not a number 0-255")
        prefix.append(int(p))
    lo, hi = _range_bounds(parts[at], text, 10, 255)
    return _Range(4, tuple(prefix), lo, hi)


def _parse_v6_range(text: str) -> _Matcher:
    groups = text.split(":")
    # RocketMQ allows '*' only as the last group and a range only in the last group, or in
    # the one before a final '*'.
    at = len(groups) - 1
    if groups[-1] == "*" and "-" in groups[-2]:
        at -= 1
    if "*" in ":".join(groups[:at]) or "-" in ":".join(groups[:at]):
        raise _bad(text, "in IPv6 only the last group may be '*', and a range only in the "
                         "last group or the one before a final '*'")
    filled = ":".join(groups[:at] + ["0"] * (len(groups) - at))
    ip = parse_ip(filled)
    if not isinstance(ip, ipaddress.IPv6Address) or "." in filled:
        raise _bad(text, "the fixed groups do not form an IPv6 address")
    index = 7 - (len(groups) - 1 - at)
    lo, hi = _range_bounds(groups[at], text, 16, 0xFFFF)
    return _Range(6, _groups(ip)[:index], lo, hi)
