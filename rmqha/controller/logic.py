"""Controller request rules: validate a request against committed state, decide the answer
and the event to commit.

Pure with respect to I/O: each function reads a :class:`ReplicasState` snapshot and the
heartbeat table and returns a :class:`Decision`; the server commits ``decision.event``
(if any) and answers only after it is applied.  Validation order, codes, remarks and header
field names follow RocketMQ's ``ReplicasInfoManager`` (``electMaster``,
``alterSyncStateSet``, ``cleanBrokerData``, ...), with the intended behaviour where upstream
has known quirks (first election checks the broker is registered; clean refuses any live
broker; a removed master leaves the group masterless).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqha.errors import ProtocolError
from rmqha.protocol.codes import ResponseCode
from rmqha.protocol.control_headers import (
    AlterSyncStateSetAnswer,
    AlterSyncStateSetHeader,
    ApplyBrokerIdHeader,
    CleanBrokerDataHeader,
    ControlHeader,
    ElectMasterAnswer,
    ElectMasterHeader,
    GetNextBrokerIdHeader,
    GetReplicaInfoHeader,
    NextBrokerIdAnswer,
    RegisterBrokerAnswer,
    RegisterBrokerToControllerHeader,
    ReplicaInfoAnswer,
)
from rmqha.controller.elect_policy import elect
from rmqha.controller.heartbeat import BrokerHeartbeatManager
from rmqha.controller.state import BrokerGroup, ReplicasState


@dataclass
class Decision:
    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    ext_fields: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    event: dict[str, Any] | None = None
    #: For elections: the new master (to notify brokers after the event is applied).
    elected: int | None = None


H = TypeVar("H", bound=ControlHeader)


def _parse(cls: type[H], ext: dict[str, str]) -> H:
    """The request's header (rmqha.protocol.control_headers); a malformed one is a BadRequest."""
    try:
        return cls.parse(ext)
    except ProtocolError as exc:
        raise BadRequest(str(exc)) from None


class BadRequest(Exception):
    """A request header is malformed (answered with CONTROLLER_INVALID_REQUEST)."""


def sync_state_body(group: BrokerGroup) -> dict[str, Any]:
    return {"syncStateSet": sorted(group.sync_state_set),
            "syncStateSetEpoch": group.sync_state_set_epoch}


class ControllerLogic:
    def __init__(self, state: ReplicasState, heartbeats: BrokerHeartbeatManager,
                 enable_elect_unclean_master: bool = False) -> None:
        self.state = state
        self.heartbeats = heartbeats
        self.enable_elect_unclean_master = enable_elect_unclean_master

    def _alive(self, name: str, broker_id: int) -> bool:
        return self.heartbeats.is_alive(name, broker_id)

    def _master_alive(self, g: BrokerGroup) -> bool:
        if g.master_id is None:
            return False
        # A new leader has not heard every broker yet, and the master may hold a lease the
        # previous leader granted: it keeps its role meanwhile.
        return self.heartbeats.master_presumed_alive(g.broker_name, g.master_id)

    # --- reads -----------------------------------------------------------------------

    def get_next_broker_id(self, ext: dict[str, str]) -> Decision:
        h = _parse(GetNextBrokerIdHeader, ext)
        cluster, name = h.cluster_name, h.broker_name
        g = self.state.group(name)
        return Decision(ext_fields=NextBrokerIdAnswer(cluster_name=cluster, broker_name=name,
                                                      next_broker_id=1 if g is None else g.next_id).build())

    def get_replica_info(self, ext: dict[str, str]) -> Decision:
        name = _parse(GetReplicaInfoHeader, ext).broker_name
        g = self.state.group(name)
        if g is None:
            return Decision(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                            "Broker metadata is not existed")
        return Decision(
            ext_fields=ReplicaInfoAnswer(master_broker_id=g.master_id, master_address=g.master_address,
                                         master_epoch=g.master_epoch).build(),
            body=sync_state_body(g),
        )

    def get_sync_state_data(self, names: Any) -> Decision:
        if not names or not isinstance(names, list):
            return Decision(ResponseCode.SYSTEM_ERROR, "not set any response code")
        table: dict[str, Any] = {}
        for name in names:
            g = self.state.group(str(name))
            if g is None:
                continue  # RocketMQ omits unknown names
            in_sync, not_in_sync = [], []
            for bid in sorted(g.brokers):
                ident = {"brokerName": name, "brokerId": bid,
                         "brokerAddress": g.brokers[bid].address,
                         "alive": self._alive(g.broker_name, bid)}
                (in_sync if bid in g.sync_state_set else not_in_sync).append(ident)
            table[name] = {
                "masterBrokerId": g.master_id, "masterAddress": g.master_address,
                "masterEpoch": g.master_epoch, "syncStateSetEpoch": g.sync_state_set_epoch,
                "inSyncReplicas": in_sync, "notInSyncReplicas": not_in_sync,
            }
        return Decision(body={"replicasInfoTable": table})

    def heartbeat_refusal(self, name: str, broker_id: int, address: str,
                          epoch: int | None) -> Decision | None:
        """Why a heartbeat must not be recorded, or None.  A broker heartbeats only as
        itself: an id registered in its group, from the address it registered, at an epoch
        the group has reached (a higher one would rank it first in the next election)."""
        g = self.state.group(name)
        if g is None or broker_id not in g.brokers:
            return Decision(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                            f"broker id {broker_id} is not registered in broker-set {name}; "
                            "heartbeat refused")
        registered = g.brokers[broker_id].address
        if registered != address:
            return Decision(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                            f"broker id {broker_id} of {name} is registered at {registered}; "
                            f"heartbeat from {address} refused (register at the new address first)")
        if epoch is not None and epoch > g.master_epoch:
            return Decision(ResponseCode.NO_PERMISSION,
                            f"heartbeat of {name}/{broker_id} claims epoch {epoch}, above the "
                            f"group's master epoch {g.master_epoch}; refused")
        return None

    # --- writes ----------------------------------------------------------------------

    def apply_broker_id(self, ext: dict[str, str]) -> Decision:
        h = _parse(ApplyBrokerIdHeader, ext)
        cluster, name, broker_id, code = h.cluster_name, h.broker_name, h.applied_broker_id, h.register_check_code
        if broker_id is None:
            raise BadRequest("header field appliedBrokerId is required")
        address = code.split(";")[0]
        header = NextBrokerIdAnswer(cluster_name=cluster, broker_name=name).build()
        revision = self.state.revision
        g = self.state.group(name)
        event = {"type": "apply_broker_id", "cluster": cluster, "broker_name": name,
                 "broker_id": broker_id, "address": address, "register_code": code,
                 "expect_revision": revision}
        if g is None:
            if broker_id == 1:
                return Decision(ext_fields=header, event=event)
            return Decision(
                ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                f"Broker-set: {name} hasn't been registered in controller, but broker try to "
                f"apply brokerId: {broker_id}; the next id is 1",
                NextBrokerIdAnswer(cluster_name=cluster, broker_name=name, next_broker_id=1).build())
        held = g.brokers.get(broker_id)
        if held is not None and held.register_code == code:
            return Decision(ext_fields=header)  # a retry of an applied id: already done
        if held is None and broker_id == g.next_id:
            return Decision(ext_fields=header, event=event)
        return Decision(
            ResponseCode.CONTROLLER_BROKER_ID_INVALID,
            f"Fail to apply brokerId: {broker_id} in broker-set: {name}; the next id is {g.next_id}",
            NextBrokerIdAnswer(cluster_name=cluster, broker_name=name, next_broker_id=g.next_id).build())

    def register_broker(self, ext: dict[str, str]) -> Decision:
        h = _parse(RegisterBrokerToControllerHeader, ext)
        cluster, name, broker_id, address = h.cluster_name, h.broker_name, h.broker_id, h.broker_address
        g = self.state.group(name)
        if g is None:
            return Decision(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                            f"Broker-set: {name} hasn't been registered in controller")
        if broker_id is None or broker_id not in g.brokers:
            return Decision(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                            f"BrokerId: {broker_id} hasn't been registered in broker-set: {name}")
        alive = g.master_id is not None and self._master_alive(g)
        header = RegisterBrokerAnswer(cluster_name=cluster, broker_name=name, master_epoch=g.master_epoch,
                                      sync_state_set_epoch=g.sync_state_set_epoch,
                                      master_broker_id=g.master_id if alive else None,
                                      master_address=g.master_address if alive else None).build()
        event = None
        if g.brokers[broker_id].address != address:
            live = self.heartbeats.info(name, broker_id)
            if live is not None and self.heartbeats.is_alive(name, broker_id) and live.address != address:
                # Two processes claim one id (a copied store, or a .broker.meta naming another
                # broker's id): the live holder keeps it; re-pointing the id would give the
                # group two masters at one epoch, or two slaves fighting over one link.
                return Decision(
                    ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                    f"broker id {broker_id} of {name} is held by the live broker at {live.address}; "
                    f"{address} cannot register with it (a copied store, or a .broker.meta naming "
                    f"another broker's id?): stop one of them, or give {address} its own store",
                    header)
            event = {"type": "update_address", "broker_name": name, "broker_id": broker_id,
                     "address": address, "expect_revision": self.state.revision}
        return Decision(ext_fields=header, body=sync_state_body(g), event=event)

    def elect_master(self, ext: dict[str, str]) -> Decision:
        h = _parse(ElectMasterHeader, ext)
        cluster, name, broker_id, designate = h.cluster_name, h.broker_name, h.broker_id, h.designate_elect
        controller_trigger = broker_id is None or broker_id < 0
        revision = self.state.revision
        g = self.state.group(name)
        if g is None:
            return Decision(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                            f"Broker {name} hasn't been registered")
        old = g.master_id
        new_master: int | None = None
        reason = ""
        if g.master_epoch == 0 and not controller_trigger:
            # First election of the group: the requesting broker, if it is registered.
            if broker_id in g.brokers:
                new_master = broker_id
            else:
                reason = f"broker {broker_id} is not registered in {name}"
        else:
            old_alive = old is not None and self._master_alive(g)
            unclean = sorted(g.brokers) if self.enable_elect_unclean_master else None

            def alive(b: int) -> bool:
                return b in g.brokers and (self._alive(name, b) or (b == old and old_alive))

            new_master = elect(
                g.sync_state_set, unclean, alive, lambda b: self.heartbeats.candidate(name, b),
                old_master=old if old_alive else None,
                designated=broker_id if designate else None,
            )
            if new_master is None:
                if designate:
                    reason = (f"broker {broker_id} is not a live candidate "
                              f"(SyncStateSet {sorted(g.sync_state_set)})")
                else:
                    reason = (f"no live broker in SyncStateSet {sorted(g.sync_state_set)}"
                              + ("" if self.enable_elect_unclean_master
                                 else " and unclean election is disabled"))
        if new_master is not None and new_master == old:
            return Decision(
                ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
                f"The old master {old} is still alive, not need to elect new master for broker {name}",
                ElectMasterAnswer(master_broker_id=old, master_address=g.master_address,
                                  master_epoch=g.master_epoch,
                                  sync_state_set_epoch=g.sync_state_set_epoch).build(),
                {"syncStateSet": sorted(g.sync_state_set)},
            )
        if new_master is not None:
            return Decision(
                ext_fields=ElectMasterAnswer(master_broker_id=new_master,
                                             master_address=g.address_of(new_master),
                                             master_epoch=g.master_epoch + 1,
                                             sync_state_set_epoch=g.sync_state_set_epoch + 1).build(),
                body={"brokerMemberGroup": {
                          "cluster": g.cluster or cluster, "brokerName": name,
                          "brokerAddrs": {str(b): e.address for b, e in sorted(g.brokers.items())}},
                      "syncStateSet": [new_master]},
                event={"type": "elect", "broker_name": name, "new_master": new_master,
                       "expect_revision": revision},
                elected=new_master,
            )
        if controller_trigger:
            return Decision(
                ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                f"Old master has down and failed to elect a new broker master: {reason}",
                ElectMasterAnswer(master_epoch=g.master_epoch + 1,
                                  sync_state_set_epoch=g.sync_state_set_epoch).build(),
                event={"type": "elect", "broker_name": name, "new_master": None,
                       "expect_revision": revision} if old is not None else None,
            )
        return Decision(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                        f"Failed to elect a new master: {reason}")

    def alter_sync_state_set(self, ext: dict[str, str], body: Any) -> Decision:
        h = _parse(AlterSyncStateSetHeader, ext)
        name, master_id, master_epoch = h.broker_name, h.master_broker_id, h.master_epoch
        if not isinstance(body, dict) or not isinstance(body.get("syncStateSet"), list):
            raise BadRequest("body must be a SyncStateSet {syncStateSet, syncStateSetEpoch}")
        try:
            new_set = sorted({int(i) for i in body["syncStateSet"]})
            body_epoch = int(body.get("syncStateSetEpoch", -1))
        except (TypeError, ValueError):
            raise BadRequest("SyncStateSet ids and epoch must be integers") from None
        failed = ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
        g = self.state.group(name)
        if g is None:
            return Decision(failed, "Broker metadata is not existed")
        if new_set == sorted(g.sync_state_set):
            return Decision(failed, "The newSyncStateSet is equal with oldSyncStateSet, "
                                    "no needed to update syncStateSet")
        if g.master_id is None or g.master_id != master_id:
            return Decision(ResponseCode.CONTROLLER_INVALID_MASTER,
                            f"Rejecting alter syncStateSet request because the current leader is:"
                            f"{g.master_id}, not {master_id}")
        if master_epoch != g.master_epoch:
            return Decision(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                            f"Rejecting alter syncStateSet request because the current master "
                            f"epoch is:{g.master_epoch}, not {master_epoch}")
        if body_epoch != g.sync_state_set_epoch:
            return Decision(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                            f"Rejecting alter syncStateSet request because the current "
                            f"syncStateSet epoch is:{g.sync_state_set_epoch}, not {body_epoch}")
        for bid in new_set:
            if bid not in g.brokers:
                return Decision(ResponseCode.CONTROLLER_INVALID_REPLICAS,
                                f"Rejecting alter syncStateSet request because the replicas "
                                f"{bid} don't exist")
            if bid != g.master_id and not self._alive(name, bid):
                return Decision(ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                                f"Rejecting alter syncStateSet request because the replicas "
                                f"{bid} don't alive")
        if g.master_id not in new_set:
            return Decision(failed, f"Rejecting alter syncStateSet request because the "
                                    f"newSyncStateSet don't contains origin leader {g.master_id}")
        new_epoch = g.sync_state_set_epoch + 1
        return Decision(
            ext_fields=AlterSyncStateSetAnswer(new_sync_state_set_epoch=new_epoch).build(),
            body={"syncStateSet": new_set, "syncStateSetEpoch": new_epoch},
            event={"type": "alter_set", "broker_name": name, "sync_state_set": new_set,
                   "expect_revision": self.state.revision},
        )

    def clean_broker_data(self, ext: dict[str, str]) -> Decision:
        h = _parse(CleanBrokerDataHeader, ext)
        name, clean_living = h.broker_name, h.is_clean_living_broker
        ids_text = (h.broker_controller_ids_to_clean or "").strip()
        invalid = ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
        g = self.state.group(name)
        if g is None:
            return Decision(invalid, f"Broker {name} is not existed,clean broker data failure.")
        ids: list[int] | None = None
        if ids_text:
            try:
                ids = sorted({int(x) for x in ids_text.split(";") if x.strip()})
            except ValueError as exc:
                return Decision(invalid, "Please set the option <brokerControllerIdsToClean> "
                                         f"according to the format, exception: {exc}")
        if not clean_living:
            targets = ids if ids is not None else sorted(g.brokers)
            living = [b for b in targets if self._alive(name, b)]
            if living:
                return Decision(invalid, f"Broker [{name}, {';'.join(map(str, living))}] is "
                                         "still alive, clean up failure")
        return Decision(event={"type": "clean", "broker_name": name, "broker_ids": ids,
                               "expect_revision": self.state.revision})

    # --- rescans ---------------------------------------------------------------------

    def groups_needing_election(self) -> list[str]:
        """Groups whose master is dead (or missing after a failed election) and that have
        a live broker who could take over."""
        if self.heartbeats.in_grace:
            return []
        _, groups = self.state.view()
        out = []
        for name, g in groups.items():
            if g.master_epoch == 0:
                continue  # never elected: the brokers start the first election
            if g.master_id is not None and self._master_alive(g):
                continue
            pool = g.brokers if self.enable_elect_unclean_master else g.sync_state_set
            if any(self._alive(name, b) for b in pool if b in g.brokers):
                out.append(name)
            elif g.master_id is not None:
                out.append(name)  # dead master, nobody to take over: record "no master"
        return out
