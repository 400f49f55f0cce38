"""Headers of the controller protocol: one class per request and per answer, used by both sides.

Before these classes a controller request's field names were typed by hand twice: where a
broker (:mod:`rmqha.controller.client`) built its ``extFields`` and where the controller
(:mod:`rmqha.controller.logic`, :mod:`rmqha.controller.server`) read them back.  Now the
sender calls :meth:`~rmqha.protocol.headers.RequestHeader.build` and the controller
:meth:`ControlHeader.parse`, as the client protocol's headers do
(:mod:`rmqha.protocol.headers`); a field's wire name (RocketMQ's, ``remoting/.../header/
controller/``) is written once, here.  Answers go the other way with the same classes: the
controller's logic builds ``...Answer`` headers, the broker's controller client parses them.

RocketMQ's Java broker writes an absent Long as the text ``null``: :meth:`ControlHeader.parse`
takes it as absent, and a malformed value raises :class:`~rmqha.errors.ProtocolError`
naming the field (the controller answers CONTROLLER_INVALID_REQUEST).  The name server's
REGISTER_BROKER travels in its body and keeps its own codec (:mod:`rmqha.namesrv`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from rmqha.errors import ProtocolError
from rmqha.protocol.headers import Ext, RequestHeader, _fields, _wire


class ControlHeader(RequestHeader):
    """A controller request header; ``null`` values count as absent and a required text
    field may not be empty (a group needs a name)."""

    @classmethod
    def parse(cls, ext: Ext) -> Self:
        for f in _fields(cls):
            if f.required and f.kind is str and not ext.get(f.wire):
                raise ProtocolError(f"header field {f.wire} is required")
        return super().parse({k: v for k, v in ext.items() if v != "null"})


@dataclass(kw_only=True)
class GetNextBrokerIdHeader(ControlHeader):
    """CONTROLLER_GET_NEXT_BROKER_ID (``GetNextBrokerIdRequestHeader``)."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName")


@dataclass(kw_only=True)
class ApplyBrokerIdHeader(ControlHeader):
    """CONTROLLER_APPLY_BROKER_ID (``ApplyBrokerIdRequestHeader``)."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName")
    applied_broker_id: int | None = _wire("appliedBrokerId", None)
    register_check_code: str = _wire("registerCheckCode")


@dataclass(kw_only=True)
class RegisterBrokerToControllerHeader(ControlHeader):
    """CONTROLLER_REGISTER_BROKER (``RegisterBrokerToControllerRequestHeader``)."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName")
    broker_id: int | None = _wire("brokerId", None)
    broker_address: str = _wire("brokerAddress")
    invoke_time: int | None = _wire("invokeTime", None)


@dataclass(kw_only=True)
class BrokerHeartbeatHeader(ControlHeader):
    """BROKER_HEARTBEAT (``BrokerHeartbeatRequestHeader``)."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName", "")
    broker_id: int | None = _wire("brokerId", None)
    broker_addr: str = _wire("brokerAddr", "")
    epoch: int | None = _wire("epoch", None)
    max_offset: int | None = _wire("maxOffset", None)
    confirm_offset: int | None = _wire("confirmOffset", None)
    heartbeat_timeout_mills: int | None = _wire("heartbeatTimeoutMills", None)
    election_priority: int | None = _wire("electionPriority", None)


@dataclass(kw_only=True)
class GetReplicaInfoHeader(ControlHeader):
    """CONTROLLER_GET_REPLICA_INFO (``GetReplicaInfoRequestHeader``)."""

    broker_name: str = _wire("brokerName")


@dataclass(kw_only=True)
class AlterSyncStateSetHeader(ControlHeader):
    """CONTROLLER_ALTER_SYNC_STATE_SET (``AlterSyncStateSetRequestHeader``); the new set
    travels in the body."""

    broker_name: str = _wire("brokerName")
    master_broker_id: int | None = _wire("masterBrokerId", None)
    master_epoch: int | None = _wire("masterEpoch", None)
    invoke_time: int | None = _wire("invokeTime", None)


@dataclass(kw_only=True)
class ElectMasterHeader(ControlHeader):
    """CONTROLLER_ELECT_MASTER (``ElectMasterRequestHeader``): a broker's election
    (``broker_id`` -1) or an admin's choice (``designate_elect``)."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName")
    broker_id: int = _wire("brokerId", -1)
    designate_elect: bool = _wire("designateElect", False)
    invoke_time: int | None = _wire("invokeTime", None)


@dataclass(kw_only=True)
class CleanBrokerDataHeader(ControlHeader):
    """CLEAN_BROKER_DATA (``CleanControllerBrokerDataRequestHeader``); ids ``;``-separated."""

    cluster_name: str = _wire("clusterName", "")
    broker_name: str = _wire("brokerName")
    broker_controller_ids_to_clean: str | None = _wire("brokerControllerIdsToClean", None)
    is_clean_living_broker: bool = _wire("isCleanLivingBroker", False)
    invoke_time: int | None = _wire("invokeTime", None)


@dataclass(kw_only=True)
class RoleChangedHeader(ControlHeader):
    """NOTIFY_BROKER_ROLE_CHANGED, controller to broker (``NotifyBrokerRoleChangedRequestHeader``);
    the SyncStateSet travels in the body."""

    master_address: str | None = _wire("masterAddress", None)
    master_epoch: int = _wire("masterEpoch", 0)
    sync_state_set_epoch: int | None = _wire("syncStateSetEpoch", None)
    master_broker_id: int | None = _wire("masterBrokerId", None)


@dataclass(kw_only=True)
class ReplicaInfoAnswer(ControlHeader):
    """CONTROLLER_GET_REPLICA_INFO's answer header (``GetReplicaInfoResponseHeader``); the
    SyncStateSet travels in the body."""

    master_broker_id: int | None = _wire("masterBrokerId", None)
    master_address: str | None = _wire("masterAddress", None)
    master_epoch: int = _wire("masterEpoch", 0)


# --- answers: the controller builds them, brokers and admin tools parse them ------------------


@dataclass(kw_only=True)
class NextBrokerIdAnswer(ControlHeader):
    """CONTROLLER_GET_NEXT_BROKER_ID's answer (``GetNextBrokerIdResponseHeader``), also the
    header of an APPLY_BROKER_ID refusal, which says which id is next."""

    cluster_name: str | None = _wire("clusterName", None)
    broker_name: str | None = _wire("brokerName", None)
    next_broker_id: int | None = _wire("nextBrokerId", None)


@dataclass(kw_only=True)
class RegisterBrokerAnswer(ControlHeader):
    """CONTROLLER_REGISTER_BROKER's answer (``RegisterBrokerToControllerResponseHeader``); the
    master is named only while it is alive, the SyncStateSet travels in the body."""

    cluster_name: str | None = _wire("clusterName", None)
    broker_name: str | None = _wire("brokerName", None)
    master_broker_id: int | None = _wire("masterBrokerId", None)
    master_address: str | None = _wire("masterAddress", None)
    master_epoch: int = _wire("masterEpoch", 0)
    sync_state_set_epoch: int | None = _wire("syncStateSetEpoch", None)


@dataclass(kw_only=True)
class ElectMasterAnswer(ControlHeader):
    """CONTROLLER_ELECT_MASTER's answer (``ElectMasterResponseHeader``), on SUCCESS and on
    CONTROLLER_MASTER_STILL_EXIST; the new SyncStateSet and the group travel in the body."""

    master_broker_id: int | None = _wire("masterBrokerId", None)
    master_address: str | None = _wire("masterAddress", None)
    master_epoch: int = _wire("masterEpoch", 0)
    sync_state_set_epoch: int = _wire("syncStateSetEpoch", 0)


@dataclass(kw_only=True)
class AlterSyncStateSetAnswer(ControlHeader):
    """CONTROLLER_ALTER_SYNC_STATE_SET's answer (``AlterSyncStateSetResponseHeader``)."""

    new_sync_state_set_epoch: int = _wire("newSyncStateSetEpoch")


@dataclass(kw_only=True)
class HeartbeatAnswerHeader(ControlHeader):
    """BROKER_HEARTBEAT's answer: rmqha's master lease (:mod:`rmqha.broker.master_lease`),
    granted with the leader's record of the group's master, and the heartbeat timeout the
    broker got (at most the controller's cap).  RocketMQ's controller answers a heartbeat
    with no header; its brokers read none of these fields."""

    lease_granted: bool = _wire("leaseGranted", False)
    master_epoch: int = _wire("masterEpoch", 0)
    master_broker_id: int | None = _wire("masterBrokerId", None)
    heartbeat_timeout_ms: int | None = _wire("heartbeatTimeoutMills", None)
