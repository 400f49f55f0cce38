"""The name server's route table: cluster -> broker groups -> id -> address.

Brokers register (REGISTER_BROKER) every ``register_period`` and are dropped after
``broker_expire_ms`` without a renewal.  In a group the master registers as id 0 and
slaves under their own controller ids.  When two brokers of one group both claim id 0
(a stale master that has not learned of its successor yet, RocketMQ #6316) the one with
the higher master epoch wins; the loser's claim is refused and every lower-epoch id-0
entry is dropped, so a dead old master can never reappear as id 0 when the new one expires.

Topic routes come from the topic configs brokers register: a group serves a topic if a
live member registered it; the master's config wins over a slave's.  This module is pure
data and logic (no sockets, clock passed in) so it is tested directly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rmqha.protocol.topics import PERM_READ_WRITE, rocketmq_topic_config

log = logging.getLogger(__name__)

MASTER_ID = 0


@dataclass(frozen=True)
class TopicConfig:
    """What a broker says about one topic (RocketMQ ``TopicConfig``, the fields routes use)."""

    topic: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0
    order: bool = False

    @classmethod
    def from_json(cls, name: str, obj: dict[str, Any]) -> TopicConfig:
        return cls(
            topic=str(obj.get("topicName", name)),
            read_queue_nums=int(obj.get("readQueueNums", 4)),
            write_queue_nums=int(obj.get("writeQueueNums", 4)),
            perm=int(obj.get("perm", PERM_READ_WRITE)),
            topic_sys_flag=int(obj.get("topicSysFlag", 0)),
            order=bool(obj.get("order", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return rocketmq_topic_config(self.topic, self.read_queue_nums, self.write_queue_nums, self.perm,
                                     self.topic_sys_flag, self.order)


@dataclass
class BrokerRegistration:
    """One live broker process as the name server knows it."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int  # as registered: 0 = master, else the controller id
    ha_addr: str = ""
    master_epoch: int = 0  # RocketMQ's DataVersion.stateVersion in controller mode
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    heartbeat_timeout_ms: int = 120_000
    last_update_ms: int = 0

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.last_update_ms > self.heartbeat_timeout_ms


@dataclass(frozen=True)
class RegisterResult:
    """Answer to a registration: accepted or not, and the group's master as now known."""

    accepted: bool
    master_addr: str = ""
    ha_server_addr: str = ""
    reason: str = ""


class RouteTable:
    """All registrations, keyed by (broker group, broker address)."""

    def __init__(self, broker_expire_ms: int = 120_000) -> None:
        self.broker_expire_ms = broker_expire_ms
        # broker_name -> broker_addr -> registration
        self._groups: dict[str, dict[str, BrokerRegistration]] = {}

    # --- writes ---------------------------------------------------------------------------

    def register(self, reg: BrokerRegistration, now_ms: int) -> RegisterResult:
        reg.last_update_ms = now_ms
        # A broker may ask for a shorter timeout than the table's, never a longer one.
        if reg.heartbeat_timeout_ms <= 0 or reg.heartbeat_timeout_ms > self.broker_expire_ms:
            reg.heartbeat_timeout_ms = self.broker_expire_ms
        group = self._groups.setdefault(reg.broker_name, {})
        if reg.broker_id == MASTER_ID:
            rival = self._master(group, exclude=reg.broker_addr)
            if rival is not None and rival.master_epoch > reg.master_epoch:
                log.warning(
                    "refusing %s as master of %s at epoch %d: %s holds id 0 at epoch %d",
                    reg.broker_addr, reg.broker_name, reg.master_epoch, rival.broker_addr, rival.master_epoch,
                )
                # Keep nothing of the refused claim: if it had a slave entry before, that
                # entry is stale too (the process now thinks it is master).
                group.pop(reg.broker_addr, None)
                return RegisterResult(False, rival.broker_addr, rival.ha_addr,
                                      f"master epoch {reg.master_epoch} < {rival.master_epoch} of {rival.broker_addr}")
            for addr, other in list(group.items()):
                if addr != reg.broker_addr and other.broker_id == MASTER_ID:
                    log.info("%s (epoch %d) replaces %s (epoch %d) as id 0 of %s",
                             reg.broker_addr, reg.master_epoch, addr, other.master_epoch, reg.broker_name)
                    del group[addr]
        else:
            # One process per controller id: a broker restarted on a new port replaces
            # its old address at once instead of showing twice until the old one expires.
            for addr, other in list(group.items()):
                if addr != reg.broker_addr and other.broker_id == reg.broker_id:
                    log.info("%s replaces %s as id %d of %s", reg.broker_addr, addr, reg.broker_id, reg.broker_name)
                    del group[addr]
        group[reg.broker_addr] = reg
        master = self._master(group)
        return RegisterResult(True, master.broker_addr if master else "", master.ha_addr if master else "")

    def unregister(self, broker_name: str, broker_addr: str) -> bool:
        group = self._groups.get(broker_name)
        if group is None or group.pop(broker_addr, None) is None:
            return False
        if not group:
            del self._groups[broker_name]
        return True

    def delete_topic(self, topic: str) -> int:
        """Forget ``topic`` in every registration (until a broker registers it again)."""
        removed = 0
        for group in self._groups.values():
            for reg in group.values():
                if reg.topics.pop(topic, None) is not None:
                    removed += 1
        return removed

    def expire(self, now_ms: int) -> list[BrokerRegistration]:
        """Drop every registration not renewed in time; return what was dropped."""
        dropped: list[BrokerRegistration] = []
        for name in list(self._groups):
            group = self._groups[name]
            for addr in list(group):
                if group[addr].expired(now_ms):
                    dropped.append(group.pop(addr))
            if not group:
                del self._groups[name]
        for reg in dropped:
            log.info("broker %s (%s id %d) expired", reg.broker_addr, reg.broker_name, reg.broker_id)
        return dropped

    # --- reads ----------------------------------------------------------------------------

    @staticmethod
    def _master(group: dict[str, BrokerRegistration], exclude: str | None = None) -> BrokerRegistration | None:
        best: BrokerRegistration | None = None
        for addr, reg in group.items():
            if addr == exclude or reg.broker_id != MASTER_ID:
                continue
            if best is None or reg.master_epoch > best.master_epoch:
                best = reg
        return best

    def group_names(self) -> list[str]:
        return sorted(self._groups)

    def members(self, broker_name: str) -> list[BrokerRegistration]:
        return sorted(self._groups.get(broker_name, {}).values(), key=lambda r: (r.broker_id, r.broker_addr))

    def broker_data(self, broker_name: str) -> dict[str, Any] | None:
        """RocketMQ ``BrokerData``: cluster, brokerName, brokerAddrs {"id": addr} (keys quoted)."""
        members = self.members(broker_name)
        if not members:
            return None
        addrs: dict[str, str] = {}
        for reg in members:
            # After register() a group has at most one entry per id; keep the newest anyway.
            key = str(reg.broker_id)
            if key not in addrs or reg.last_update_ms >= self._groups[broker_name][addrs[key]].last_update_ms:
                addrs[key] = reg.broker_addr
        return {"cluster": members[0].cluster, "brokerName": broker_name, "brokerAddrs": addrs}

    def group_route(self, broker_name: str) -> dict[str, Any] | None:
        """The route of one broker group, with HA addresses and the master epoch."""
        members = self.members(broker_name)
        if not members:
            return None
        master = self._master(self._groups[broker_name])
        data = self.broker_data(broker_name)
        assert data is not None
        data["haAddrs"] = {str(r.broker_id): r.ha_addr for r in members}
        data["masterEpoch"] = master.master_epoch if master else max(r.master_epoch for r in members)
        data["masterAddr"] = master.broker_addr if master else ""
        return data

    def _group_topics(self, broker_name: str) -> dict[str, TopicConfig]:
        topics: dict[str, TopicConfig] = {}
        # Slaves first, master last: the master's config wins.
        for reg in sorted(self._groups.get(broker_name, {}).values(), key=lambda r: r.broker_id == MASTER_ID):
            topics.update(reg.topics)
        return topics

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """RocketMQ ``TopicRouteData`` of a topic, or None when no live group serves it.

        Integers are JSON numbers and brokerAddrs keys are quoted strings: the shape the
        C++ client (rocketmq 0.4.4) and the Java client both parse.
        """
        queue_datas: list[dict[str, Any]] = []
        broker_datas: list[dict[str, Any]] = []
        for name in self.group_names():
            cfg = self._group_topics(name).get(topic)
            if cfg is None:
                continue
            queue_datas.append({
                "brokerName": name,
                "readQueueNums": cfg.read_queue_nums,
                "writeQueueNums": cfg.write_queue_nums,
                "perm": cfg.perm,
                "topicSysFlag": cfg.topic_sys_flag,
            })
            data = self.broker_data(name)
            if data is not None:
                broker_datas.append(data)
        if not queue_datas:
            return None
        return {"orderTopicConf": "", "queueDatas": queue_datas, "brokerDatas": broker_datas, "filterServerTable": {}}

    def cluster_info(self) -> dict[str, Any]:
        """RocketMQ ``ClusterInfo``: brokerAddrTable and clusterAddrTable."""
        broker_addr_table: dict[str, Any] = {}
        cluster_addr_table: dict[str, list[str]] = {}
        for name in self.group_names():
            data = self.broker_data(name)
            if data is None:
                continue
            broker_addr_table[name] = data
            cluster_addr_table.setdefault(data["cluster"], []).append(name)
        return {"brokerAddrTable": broker_addr_table, "clusterAddrTable": cluster_addr_table}

    def topics(self) -> list[str]:
        names: set[str] = set()
        for name in self._groups:
            names.update(self._group_topics(name))
        return sorted(names)
