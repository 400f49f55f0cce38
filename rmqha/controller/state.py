"""The replicated state machine of the controller: broker groups and their events.

Per broker group (keyed by broker name, as RocketMQ keys it): cluster name, next broker id
(from 1), each broker's address and register code, master id, master epoch, SyncStateSet
and its epoch.  The state changes only through committed events, applied in log order on
every controller (also when the journal is replayed):

=====================  ===================================================================
``apply_broker_id``    add an id (creating the group on its first id); next id = max+1
``update_address``     change a registered broker's address
``elect``              ``new_master`` set: master = it, master epoch + 1, SyncStateSet =
                       {it}, set epoch + 1.  ``new_master`` null: no master, master epoch
                       + 1, SyncStateSet and its epoch kept
``alter_set``          replace the SyncStateSet, set epoch + 1
``clean``              remove ids (all of the group when ``broker_ids`` is null); a removed
                       master leaves the group without a master
``barrier``            a new leader's first commit, so it has applied everything; with
                       ``leader_id`` and ``address`` it records the address the leader
                       advertises, which every controller then names it by
``batch``              the listed events in order (group commit of concurrent writes that
                       the leader validated one after another)
=====================  ===================================================================

The advertised addresses travel in the log, not in each controller's config, so a follower
names a leader behind a NAT or proxy by the address that leader chose, and a controller
restarted with a new one is named by it from its next term on.  They are not part of
``revision`` (no broker write is validated against them).

Every event carries ``expect_revision``, the state revision the leader validated against.
An event whose revision no longer matches (a stale leader's write that reached the log
after a newer one) is skipped on every replica, so validation and apply can never disagree.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class BrokerEntry:
    address: str
    register_code: str


@dataclass
class BrokerGroup:
    cluster: str
    broker_name: str
    next_id: int = 1
    brokers: dict[int, BrokerEntry] = field(default_factory=dict)
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0

    @property
    def master_address(self) -> str | None:
        if self.master_id is None:
            return None
        entry = self.brokers.get(self.master_id)
        return entry.address if entry else None

    def address_of(self, broker_id: int) -> str | None:
        entry = self.brokers.get(broker_id)
        return entry.address if entry else None

    def copy(self) -> BrokerGroup:
        """A deep copy (much cheaper than copy.deepcopy for this shape)."""
        return BrokerGroup(
            self.cluster, self.broker_name, self.next_id,
            {k: BrokerEntry(v.address, v.register_code) for k, v in self.brokers.items()},
            self.master_id, self.master_epoch, list(self.sync_state_set),
            self.sync_state_set_epoch)

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster, "broker_name": self.broker_name, "next_id": self.next_id,
            "brokers": {str(k): [v.address, v.register_code] for k, v in self.brokers.items()},
            "master_id": self.master_id, "master_epoch": self.master_epoch,
            "sync_state_set": list(self.sync_state_set),
            "sync_state_set_epoch": self.sync_state_set_epoch,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BrokerGroup:
        return cls(
            cluster=d["cluster"], broker_name=d["broker_name"], next_id=d["next_id"],
            brokers={int(k): BrokerEntry(v[0], v[1]) for k, v in d["brokers"].items()},
            master_id=d["master_id"], master_epoch=d["master_epoch"],
            sync_state_set=list(d["sync_state_set"]),
            sync_state_set_epoch=d["sync_state_set_epoch"],
        )


class ReplicasState:
    """The state, its event application and JSON snapshots (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.revision = 0
        self.groups: dict[str, BrokerGroup] = {}
        #: Controller id -> the address it advertised in its last leader barrier.
        self.advertised: dict[str, str] = {}

    # --- reads -----------------------------------------------------------------------

    def group(self, broker_name: str) -> BrokerGroup | None:
        """A copy of one group (reads never see a half-applied event)."""
        with self._lock:
            g = self.groups.get(broker_name)
            return g.copy() if g is not None else None

    def advertised_address(self, controller_id: str) -> str | None:
        """The address controller ``controller_id`` advertised when it last led, if any."""
        with self._lock:
            return self.advertised.get(controller_id)

    def overlay(self) -> ReplicasState:
        """A scratch state on top of this one: reads fall through, events change only the
        overlay (groups are copied when first touched).  The leader validates a batch of
        writes against one, each seeing the effects of the ones before it."""
        return _Overlay(self)

    def view(self) -> tuple[int, dict[str, BrokerGroup]]:
        with self._lock:
            return self.revision, {k: g.copy() for k, g in self.groups.items()}

    # --- events ----------------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> dict[str, Any]:
        """Apply one committed event; never raises (a bad event is logged and skipped)."""
        with self._lock:
            kind = event.get("type")
            if kind == "barrier":
                leader, address = event.get("leader_id"), event.get("address")
                if isinstance(leader, str) and isinstance(address, str) and leader and address:
                    self.advertised[leader] = address
                return {"ok": True, "revision": self.revision}
            if kind == "batch":
                events = event.get("events")
                if not isinstance(events, list):
                    return {"ok": False, "reason": "malformed batch"}
                return {"ok": True, "results": [self.apply(e) if isinstance(e, dict)
                                                else {"ok": False, "reason": "not an event"}
                                                for e in events]}
            expect = event.get("expect_revision")
            if expect != self.revision:
                return {"ok": False, "reason": f"stale: revision {self.revision}, expected {expect}"}
            handler = _APPLY.get(kind)  # type: ignore[arg-type]
            self._prepare(event.get("broker_name"))
            if handler is None:
                log.error("skipping unknown controller event %r", kind)
                return {"ok": False, "reason": f"unknown event {kind!r}"}
            try:
                handler(self, event)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("skipping malformed controller event %r: %s", event, exc)
                return {"ok": False, "reason": f"malformed event: {exc}"}
            self.revision += 1
            return {"ok": True, "revision": self.revision}

    def _prepare(self, broker_name: Any) -> None:
        """Hook for overlays: make ``self.groups`` hold the group an event will change."""

    def _apply_broker_id(self, e: dict[str, Any]) -> None:
        name, broker_id = e["broker_name"], int(e["broker_id"])
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = BrokerGroup(cluster=e["cluster"], broker_name=name)
        if broker_id not in g.brokers:
            g.brokers[broker_id] = BrokerEntry(e["address"], e["register_code"])
        # max(id)+1, not "count additions" (upstream quirk: an out-of-order id made
        # GetNextBrokerId return an id already taken).
        g.next_id = max(g.next_id, broker_id + 1)

    def _update_address(self, e: dict[str, Any]) -> None:
        g = self.groups[e["broker_name"]]
        entry = g.brokers.get(int(e["broker_id"]))
        if entry is not None:
            entry.address = e["address"]

    def _elect(self, e: dict[str, Any]) -> None:
        g = self.groups[e["broker_name"]]
        new_master = e.get("new_master")
        g.master_epoch += 1
        if new_master is None:
            g.master_id = None
        else:
            g.master_id = int(new_master)
            g.sync_state_set = [int(new_master)]
            g.sync_state_set_epoch += 1

    def _alter_set(self, e: dict[str, Any]) -> None:
        g = self.groups[e["broker_name"]]
        g.sync_state_set = sorted(int(i) for i in e["sync_state_set"])
        g.sync_state_set_epoch += 1

    def _clean(self, e: dict[str, Any]) -> None:
        name = e["broker_name"]
        ids = e.get("broker_ids")
        if not ids:
            self.groups.pop(name, None)
            return
        g = self.groups.get(name)
        if g is None:
            return
        for i in (int(x) for x in ids):
            g.brokers.pop(i, None)
            if i in g.sync_state_set:
                g.sync_state_set.remove(i)
            if g.master_id == i:
                g.master_id = None
        if not g.brokers:
            del self.groups[name]

    # --- snapshots -------------------------------------------------------------------

    def snapshot(self) -> str:
        with self._lock:
            return json.dumps({
                "revision": self.revision,
                "groups": {k: g.to_json() for k, g in self.groups.items()},
                "advertised": dict(self.advertised),
            }, sort_keys=True)

    def restore(self, text: str) -> None:
        data = json.loads(text)
        with self._lock:
            self.revision = int(data["revision"])
            self.groups = {k: BrokerGroup.from_json(v) for k, v in data["groups"].items()}
            # Snapshots from before advertised addresses have none: peers' addresses apply.
            self.advertised = {str(k): str(v) for k, v in data.get("advertised", {}).items()}

    def digest(self) -> str:
        """A stable fingerprint of the whole state (tests compare replicas with it)."""
        import hashlib

        return hashlib.sha256(self.snapshot().encode()).hexdigest()


class _Overlay(ReplicasState):
    def __init__(self, base: ReplicasState) -> None:
        super().__init__()
        self._base = base
        self._deleted: set[str] = set()
        with base._lock:
            self.revision = base.revision

    def _prepare(self, broker_name: Any) -> None:
        if isinstance(broker_name, str) and broker_name not in self.groups \
                and broker_name not in self._deleted:
            g = self._base.group(broker_name)
            if g is not None:
                self.groups[broker_name] = g

    def apply(self, event: dict[str, Any]) -> dict[str, Any]:
        result = super().apply(event)
        name = event.get("broker_name")
        if isinstance(name, str):
            if name in self.groups:
                self._deleted.discard(name)
            elif event.get("type") == "clean":
                self._deleted.add(name)
        return result

    def group(self, broker_name: str) -> BrokerGroup | None:
        if broker_name in self._deleted:
            return None
        g = self.groups.get(broker_name)
        return g.copy() if g is not None else self._base.group(broker_name)

    def view(self) -> tuple[int, dict[str, BrokerGroup]]:
        _, groups = self._base.view()
        for name in self._deleted:
            groups.pop(name, None)
        groups.update({k: g.copy() for k, g in self.groups.items()})
        return self.revision, groups


_APPLY = {
    "apply_broker_id": ReplicasState._apply_broker_id,
    "update_address": ReplicasState._update_address,
    "elect": ReplicasState._elect,
    "alter_set": ReplicasState._alter_set,
    "clean": ReplicasState._clean,
}
