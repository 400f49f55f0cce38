"""Resolving ``-c cluster`` / ``-b broker name`` to broker groups and addresses for admin commands.

mqadmin resolves clusters and broker names through the name server's cluster info
(GET_BROKER_CLUSTER_INFO); so do these helpers.  The first name server that answers wins.
"""
from __future__ import annotations

from dataclasses import dataclass

from rmqha.protocol.codes import RequestCode
from rmqha.errors import ClientError, RemotingError
from rmqha.net.blocking import BlockingRemotingClient
from rmqha.net.client_security import ClientSecurity, ServerRole
from rmqha.protocol.command import RemotingCommand


@dataclass(frozen=True)
class Member:
    """One broker as the name server lists it (id 0 = the group's master)."""

    cluster: str
    broker_name: str
    namesrv_id: int
    address: str


def split_addresses(value: str) -> list[str]:
    return [a.strip() for a in value.replace(",", ";").split(";") if a.strip()]


def cluster_info(namesrv: str, timeout: float = 3.0, security: ClientSecurity | None = None) -> dict:
    """The ClusterInfo body (brokerAddrTable, clusterAddrTable) of the first name server
    that answers; RemotingError naming every address tried when none does."""
    errors = []
    for addr in split_addresses(namesrv):
        try:
            with BlockingRemotingClient(addr, connect_timeout=timeout, security=security,
                                        expect=ServerRole.namesrv()) as client:
                resp = client.request(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout)
        except (RemotingError, TimeoutError) as exc:
            errors.append(f"{addr}: {exc or type(exc).__name__}")
            continue
        resp.check_success(RequestCode.GET_BROKER_CLUSTER_INFO)
        return resp.json_body() or {}
    raise RemotingError("no name server answered (" + "; ".join(errors or ["no address given"]) + ")")


def members(namesrv: str, *, cluster: str | None = None, broker_names: list[str] | None = None,
            timeout: float = 3.0, security: ClientSecurity | None = None) -> list[Member]:
    """Every live broker of the named groups (or of a cluster, or of all), master first."""
    info = cluster_info(namesrv, timeout, security)
    table = info.get("brokerAddrTable") or {}
    names = set(table)
    if cluster is not None:
        clusters = info.get("clusterAddrTable") or {}
        if cluster not in clusters:
            raise ClientError(f"cluster {cluster!r} is not known to the name server "
                              f"(known: {', '.join(sorted(clusters)) or 'none'})")
        names &= set(clusters[cluster])
    if broker_names:
        missing = sorted(set(broker_names) - set(table))
        if missing:
            raise ClientError(f"broker group(s) {', '.join(missing)} not registered with the name server")
        names &= set(broker_names)
    out = []
    for name in sorted(names):
        data = table[name]
        for bid, addr in sorted((data.get("brokerAddrs") or {}).items(), key=lambda kv: int(kv[0])):
            out.append(Member(str(data.get("cluster", "")), name, int(bid), str(addr)))
    return out


def group_names(namesrv: str, cluster: str, timeout: float = 3.0,
                security: ClientSecurity | None = None) -> list[str]:
    """The broker group names of ``cluster``."""
    return sorted({m.broker_name for m in members(namesrv, cluster=cluster, timeout=timeout,
                                                  security=security)})


def is_address(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit())
