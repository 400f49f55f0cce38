"""Broker liveness as one controller sees it (heartbeats, timeouts, closed connections).

Every controller records the heartbeats it receives (brokers heartbeat all controllers,
RocketMQ #5712), but only the leader acts on liveness.  A broker is alive while its last
heartbeat is younger than the timeout it asked for and the connection it came on is open.
Within one epoch the recorded max offset never goes down (a late heartbeat cannot make a
replica look further behind than it was).  A new leader waits ``new_leader_wait`` for
fresh heartbeats before declaring anyone dead: until then it triggers no election and the
current master gets the benefit of the doubt.

The master lease (:mod:`rmqha.broker.master_lease`) adds one more wait: a new leader does
not know when the previous leader last renewed a master's lease, so for a heartbeat
timeout after it became leader it treats every master as alive (the *lease guard*),
unless it saw that master's heartbeat connection close while leading and the master is
gone (a dead process acknowledges nothing, so that election need not wait).  A close seen
before it led does not count: that link may have failed alone.

A closed heartbeat connection alone proves nothing (a reset link, a restarted proxy): the
controller server checks the broker's address (``close_probe``) and only a refused
connection drops the broker before its timeout.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rmqha.controller.elect_policy import CandidateInfo
from rmqha.net.peer import RequestPeer

DEFAULT_PRIORITY = 2**31 - 1


@dataclass
class BrokerLiveInfo:
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    last_update: float
    timeout_s: float
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    priority: int = DEFAULT_PRIORITY
    conn: RequestPeer | None = None

    def expired(self, now: float) -> bool:
        return now - self.last_update > self.timeout_s


InactiveListener = Callable[[str, str, int], None]
#: Asked whether a broker whose heartbeat connection closed is really gone; it answers
#: later through :meth:`BrokerHeartbeatManager.confirm_gone`.
CloseProbe = Callable[["BrokerLiveInfo"], None]


class BrokerHeartbeatManager:
    """The heartbeat table of one controller; times are ``time.monotonic()`` seconds."""

    def __init__(self, new_leader_wait_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic, *,
                 default_timeout_s: float = 10.0) -> None:
        self._table: dict[tuple[str, int], BrokerLiveInfo] = {}
        self._clock = clock
        self.new_leader_wait_s = new_leader_wait_s
        #: The heartbeat timeout assumed for a broker never heard from (the lease guard's
        #: length when a broker's own timeout is unknown).
        self.default_timeout_s = default_timeout_s
        self._leader_since: float | None = None
        self._listeners: list[InactiveListener] = []
        #: Brokers whose heartbeat connection closed and who have not heartbeated since.
        self._closed: set[tuple[str, int]] = set()
        #: The heartbeat timeout each broker last asked for (kept after its entry expires).
        self._timeouts: dict[tuple[str, int], float] = {}
        #: When set, a closed connection only starts a check of the broker (the server
        #: tries its address); without it a close is taken as the broker's death.
        self.close_probe: CloseProbe | None = None
        #: The newest signed timestamp (ms) of each broker's heartbeats taken here.
        self._signed_ms: dict[tuple[str, int], int] = {}

    def add_inactive_listener(self, fn: InactiveListener) -> None:
        """fn(cluster, broker_name, broker_id) when a broker times out or disconnects."""
        self._listeners.append(fn)

    # --- leadership ------------------------------------------------------------------

    def on_leader(self) -> None:
        self._leader_since = self._clock()
        # Only closes seen as leader end the lease guard: a close seen earlier may have
        # been a link to this node alone, while the broker renewed with the old leader.
        self._closed.clear()

    def on_not_leader(self) -> None:
        self._leader_since = None

    @property
    def in_grace(self) -> bool:
        """True while a new leader is still collecting fresh heartbeats."""
        return (self._leader_since is not None
                and self._clock() - self._leader_since < self.new_leader_wait_s)

    def lease_guard_remaining(self, broker_name: str, broker_id: int) -> float:
        """Seconds this leader must still treat the broker as a live master (0 = none).

        A lease the previous leader granted lasts less than the broker's heartbeat timeout
        from a heartbeat sent before this leader took over; a closed connection ends the
        wait (the broker died)."""
        if self._leader_since is None:
            return 0.0
        key = (broker_name, broker_id)
        if key in self._closed:
            return 0.0
        timeout = max(self.default_timeout_s, self._timeouts.get(key, 0.0))
        return max(0.0, self._leader_since + timeout - self._clock())

    def master_presumed_alive(self, broker_name: str, broker_id: int) -> bool:
        """Whether a master must be treated as alive: heard within its timeout, or this
        leader is too new to judge (grace for fresh heartbeats, or the lease guard)."""
        return (self.is_alive(broker_name, broker_id) or self.in_grace
                or self.lease_guard_remaining(broker_name, broker_id) > 0)

    def judge_wait(self, broker_name: str, broker_id: int) -> float:
        """Seconds until this leader may judge the master dead (0 = now)."""
        grace = 0.0
        if self._leader_since is not None:
            grace = max(0.0, self._leader_since + self.new_leader_wait_s - self._clock())
        return max(grace, self.lease_guard_remaining(broker_name, broker_id))

    # --- input -----------------------------------------------------------------------

    def is_newer(self, broker_name: str, broker_id: int, signed_ms: int | None) -> bool:
        """Whether a heartbeat signed at ``signed_ms`` is newer than every heartbeat taken
        from that broker (an unsigned one, None, is not judged).  A broker signs each round
        of heartbeats once, for every controller: the copy it sent another controller is
        never newer here, so replaying it cannot keep a dead broker alive."""
        if signed_ms is None:
            return True
        return signed_ms > self._signed_ms.get((broker_name, broker_id), -1)

    def on_heartbeat(
        self, cluster: str, broker_name: str, broker_id: int, address: str, *,
        epoch: int | None = None, max_offset: int | None = None,
        confirm_offset: int | None = None, timeout_ms: int | None = None,
        priority: int | None = None, conn: RequestPeer | None = None, default_timeout_ms: int = 10000,
        signed_ms: int | None = None,
    ) -> None:
        now = self._clock()
        key = (broker_name, broker_id)
        if signed_ms is not None:
            self._signed_ms[key] = max(signed_ms, self._signed_ms.get(key, -1))
        timeout_s = (timeout_ms if timeout_ms and timeout_ms > 0 else default_timeout_ms) / 1000
        prev = self._table.get(key)
        self._closed.discard(key)
        self._timeouts[key] = timeout_s
        e = -1 if epoch is None else epoch
        mo = -1 if max_offset is None else max_offset
        co = -1 if confirm_offset is None else confirm_offset
        pr = DEFAULT_PRIORITY if priority is None else priority
        if prev is None:
            info = BrokerLiveInfo(cluster, broker_name, broker_id, address, now, timeout_s,
                                  e, mo, co, pr, conn)
            self._table[key] = info
        else:
            prev.last_update = now
            prev.timeout_s = timeout_s
            prev.priority = pr
            prev.address = address
            prev.cluster = cluster
            if conn is not None:
                prev.conn = conn
            if e > prev.epoch or (e == prev.epoch and mo > prev.max_offset):
                prev.epoch, prev.max_offset, prev.confirm_offset = e, mo, co
            elif e == prev.epoch:
                prev.confirm_offset = max(prev.confirm_offset, co)
            info = prev
        if conn is not None and hasattr(conn, "add_close_callback"):
            tracked = conn.attributes.setdefault("heartbeat_keys", set())
            if not tracked:
                conn.add_close_callback(self._on_conn_closed)
            tracked.add(key)

    def _on_conn_closed(self, conn: RequestPeer) -> None:
        for key in list(conn.attributes.get("heartbeat_keys", ())):
            info = self._table.get(key)
            if info is not None and info.conn is conn:
                if self.close_probe is None:
                    self._gone(info)
                else:
                    # A link can close under a live broker (a reset, a restarted proxy):
                    # only a broker shown gone is dead before its timeout runs out.
                    info.conn = None
                    self.close_probe(info)

    def confirm_gone(self, info: BrokerLiveInfo, last_update: float) -> None:
        """The close probe found the broker gone: drop it now, unless it heartbeated since."""
        key = (info.broker_name, info.broker_id)
        if self._table.get(key) is info and info.last_update == last_update:
            self._gone(info)

    def _gone(self, info: BrokerLiveInfo) -> None:
        del self._table[(info.broker_name, info.broker_id)]
        self._closed.add((info.broker_name, info.broker_id))
        self._notify(info)

    def _notify(self, info: BrokerLiveInfo) -> None:
        for fn in self._listeners:
            fn(info.cluster, info.broker_name, info.broker_id)

    def scan(self) -> list[BrokerLiveInfo]:
        """Drop expired entries, tell the listeners, return what was dropped."""
        now = self._clock()
        dead = [i for i in self._table.values() if i.expired(now)]
        for info in dead:
            del self._table[(info.broker_name, info.broker_id)]
            if info.conn is not None and hasattr(info.conn, "close"):
                info.conn.attributes.get("heartbeat_keys", set()).discard(
                    (info.broker_name, info.broker_id))
            self._notify(info)
        return dead

    def remove_group(self, broker_name: str, ids: list[int] | None = None) -> None:
        for key in [k for k in self._table if k[0] == broker_name and (ids is None or k[1] in ids)]:
            del self._table[key]
        for key in [k for k in self._timeouts if k[0] == broker_name and (ids is None or k[1] in ids)]:
            del self._timeouts[key]
            self._closed.discard(key)
        for key in [k for k in self._signed_ms if k[0] == broker_name and (ids is None or k[1] in ids)]:
            del self._signed_ms[key]

    # --- queries ---------------------------------------------------------------------

    def is_alive(self, broker_name: str, broker_id: int) -> bool:
        info = self._table.get((broker_name, broker_id))
        if info is None:
            return False
        if info.expired(self._clock()):
            return False
        return True

    def info(self, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        return self._table.get((broker_name, broker_id))

    def candidate(self, broker_name: str, broker_id: int) -> CandidateInfo:
        info = self._table.get((broker_name, broker_id))
        if info is None:
            return CandidateInfo(broker_id)
        return CandidateInfo(broker_id, info.epoch, info.max_offset, info.priority)

    def alive_count(self, broker_name: str) -> int:
        now = self._clock()
        return sum(1 for (n, _), i in self._table.items() if n == broker_name and not i.expired(now))

    def entries(self) -> list[BrokerLiveInfo]:
        return list(self._table.values())
