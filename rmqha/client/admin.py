"""Topic administration through the name server: create, update and delete topics on the
masters of chosen broker groups (RocketMQ's UPDATE_AND_CREATE_TOPIC / DELETE_TOPIC_IN_BROKER).

The groups come from the name server's cluster info (GET_BROKER_CLUSTER_INFO); a topic
spread over several groups gets its queues on each of them, and producers and consumers
then see the union in the topic's route.
"""
from __future__ import annotations

from dataclasses import dataclass

from rmqha.client.route import ClientSession
from rmqha.protocol.codes import RequestCode, ResponseCode
from rmqha.errors import ClientError, RemotingError
from rmqha.protocol.headers import CreateTopicHeader, DeleteTopicHeader
from rmqha.protocol.topics import PERM_READ_WRITE
from rmqha.net.client_security import ClientSecurity, TlsOption
from rmqha.protocol.command import RemotingCommand


@dataclass
class TopicChange:
    """The outcome on one broker group."""

    broker_name: str
    address: str
    ok: bool
    remark: str = ""


class TopicAdmin:
    """Create and delete topics on broker groups found through the name servers."""

    def __init__(self, namesrv: str | list[str], *, admin_token: str | None = None,
                 timeout_s: float = 5.0, access_key: str | None = None,
                 secret_key: str | None = None, tls: TlsOption = None) -> None:
        self.session = ClientSession(namesrv, rpc_timeout_s=timeout_s, security=ClientSecurity.from_options(
            access_key=access_key, secret_key=secret_key, tls=tls))
        self.admin_token = admin_token
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> TopicAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def masters(self, groups: list[str] | None = None,
                      cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address for the named groups (or a cluster's, or all)."""
        last: Exception | None = None
        for ns in self.session.namesrv:
            try:
                resp = await self.session.request(ns, RemotingCommand.request(
                    RequestCode.GET_BROKER_CLUSTER_INFO))
            except RemotingError as exc:
                last = exc
                continue
            if resp.code != ResponseCode.SUCCESS:
                last = ClientError(f"cluster info refused by {ns}: {resp.remark}")
                continue
            info = resp.json_body() or {}
            table = info.get("brokerAddrTable") or {}
            names = set(table)
            if cluster:
                names &= set((info.get("clusterAddrTable") or {}).get(cluster, []))
            if groups:
                missing = set(groups) - set(table)
                if missing:
                    raise ClientError(f"unknown broker group(s): {', '.join(sorted(missing))}")
                names &= set(groups)
            out = {}
            for name in sorted(names):
                addrs = table[name].get("brokerAddrs") or {}
                master = addrs.get("0", addrs.get(0))
                if master is None:
                    raise ClientError(f"broker group {name} has no master right now")
                out[name] = str(master)
            if not out:
                raise ClientError("no broker group matches")
            return out
        raise ClientError(f"no name server answered: {last}")

    async def create_topic(self, topic: str, read_queue_nums: int = 8,
                           write_queue_nums: int | None = None, *, perm: int = PERM_READ_WRITE,
                           groups: list[str] | None = None,
                           cluster: str | None = None) -> list[TopicChange]:
        """Create or update ``topic`` on every chosen group's master."""
        write_n = read_queue_nums if write_queue_nums is None else write_queue_nums
        out = []
        for name, addr in (await self.masters(groups, cluster)).items():
            cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, CreateTopicHeader(
                topic=topic, read_queue_nums=read_queue_nums, write_queue_nums=write_n,
                perm=perm, admin_token=self.admin_token or None).build())
            out.append(await self._apply(name, addr, cmd))
        return out

    async def delete_topic(self, topic: str, *, groups: list[str] | None = None,
                           cluster: str | None = None) -> list[TopicChange]:
        out = []
        for name, addr in (await self.masters(groups, cluster)).items():
            cmd = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicHeader(
                topic=topic, admin_token=self.admin_token or None).build())
            out.append(await self._apply(name, addr, cmd))
        return out

    async def _apply(self, name: str, addr: str, cmd: RemotingCommand) -> TopicChange:
        try:
            resp = await self.session.request(addr, cmd, self.timeout_s)
        except RemotingError as exc:
            return TopicChange(name, addr, False, str(exc))
        return TopicChange(name, addr, resp.code == ResponseCode.SUCCESS, resp.remark or "")
