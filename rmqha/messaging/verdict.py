"""Whether a send gets SEND_OK: one pure function from facts to the answer's status.

Every answer a write gets from its broker, the refusal before anything is written as the
status after it is stored, is :func:`verdict` of six facts that the layers report and do
not judge themselves:

============  ===============================================================  ==============
fact          what it says                                                     reported by
============  ===============================================================  ==============
``master``    this broker's messaging role is master                           ``MessagingContext.role``,
                                                                               ``RoleFence``
``lease``     it holds the controller's lease for the epoch it is master of    ``Replication.holds_master_lease``
``in_sync``   replicas counted for ``min_in_sync_replicas`` (the SyncStateSet)  ``Replication.sync_state_set_size``
``floor``     ``min_in_sync_replicas``                                         the broker config
``copies``    :class:`Copies`: not asked yet, or whether the ack policy's      the HA master's waiters
              copies of the send's end exist (``rmqha.ha.confirm``)
``flush``     :class:`Flush`: the group commit's fsync with ``flush = sync``   ``LogWriter``
============  ===============================================================  ==============

The rules, in the order they are applied:

* **Before anything is written** (``copies`` is :attr:`Copies.UNASKED`; ``flush`` cannot
  have happened and is not read): a broker that is not master answers
  SERVICE_NOT_AVAILABLE / NOT_MASTER, a master without its lease SERVICE_NOT_AVAILABLE /
  MASTER_LEASE_EXPIRED (another master may be elected any moment; clients retry
  elsewhere), a SyncStateSet smaller than the floor SYSTEM_ERROR /
  IN_SYNC_REPLICAS_NOT_ENOUGH (as RocketMQ's store: a definite failure, nothing stored);
  else the write is admitted (:attr:`Outcome.PUT_OK`).
* **After it is stored**: a failed fsync is SYSTEM_ERROR / FLUSH_DISK_FAILED (stored, not
  known to be on disk), an fsync slower than the timeout FLUSH_DISK_TIMEOUT; copies that
  did not arrive in time are FLUSH_SLAVE_TIMEOUT ("stored, not confirmed": a retry may
  duplicate it), and so is a send whose copies are there but whose broker is no longer a
  master holding its lease: an acknowledgement is a master's promise, and a master whose
  lease ran out while the send waited may already have a successor.  Only then PUT_OK.
  The SyncStateSet's size is not read here: copies that exist are at least the floor
  (the HA master's rule counts it), and a set that shrank while the send waited leaves
  it FLUSH_SLAVE_TIMEOUT, never the refusal IN_SYNC_REPLICAS_NOT_ENOUGH.

SLAVE_NOT_AVAILABLE (RocketMQ's master-slave answer for a sync master without a slave)
is never given: a controller-mode group without its copies answers
IN_SYNC_REPLICAS_NOT_ENOUGH before writing, or FLUSH_SLAVE_TIMEOUT after.

The epoch is not a fact of its own: the lease is held for the epoch the broker is master
of (``rmqha.broker.master_lease``), a master re-elected at a newer epoch keeps its log (a
send stored under the older epoch is still safe to acknowledge), and a master that steps
down stops its HA side, whose waiters then answer short.

The inputs are plain values (two booleans, two small integers, two small integer enums)
and the result a small integer enum, so a thread without the interpreter (issue 39's
compiled data plane) can compute the same verdict; ``tests/unit/test_send_verdict.py``
checks every combination against rules written out independently.
"""
from __future__ import annotations

from enum import IntEnum

from rmqha.protocol.codes import ResponseCode


class Copies(IntEnum):
    """What is known of a send's copies."""

    #: Nothing is stored yet: the verdict admits or refuses the write.
    UNASKED = 0
    #: The ack policy's copies of the send's end exist (``rmqha.ha.confirm.ConfirmRule``).
    HELD = 1
    #: The wait for them ended without them (timeout, or the HA master stopped).
    SHORT = 2


class Flush(IntEnum):
    """What became of the send's fsync."""

    #: ``flush = async``: nothing waited for.
    NONE = 0
    #: ``flush = sync``: the group commit covered it within the timeout.
    DONE = 1
    #: The group commit did not end within ``slave_timeout_ms`` (it may still succeed).
    LATE = 2
    #: The group commit's fsync failed.
    FAILED = 3


class Outcome(IntEnum):
    """A verdict; :data:`ANSWERS` gives each its response code and put status."""

    PUT_OK = 0
    NOT_MASTER = 1
    MASTER_LEASE_EXPIRED = 2
    IN_SYNC_REPLICAS_NOT_ENOUGH = 3
    FLUSH_DISK_FAILED = 4
    FLUSH_DISK_TIMEOUT = 5
    FLUSH_SLAVE_TIMEOUT = 6


#: (response code, put status) of each :class:`Outcome`, indexed by it.
ANSWERS: tuple[tuple[int, str], ...] = (
    (ResponseCode.SUCCESS, "PUT_OK"),
    (ResponseCode.SERVICE_NOT_AVAILABLE, "NOT_MASTER"),
    (ResponseCode.SERVICE_NOT_AVAILABLE, "MASTER_LEASE_EXPIRED"),
    (ResponseCode.SYSTEM_ERROR, "IN_SYNC_REPLICAS_NOT_ENOUGH"),
    (ResponseCode.SYSTEM_ERROR, "FLUSH_DISK_FAILED"),
    (ResponseCode.FLUSH_DISK_TIMEOUT, "FLUSH_DISK_TIMEOUT"),
    (ResponseCode.FLUSH_SLAVE_TIMEOUT, "FLUSH_SLAVE_TIMEOUT"),
)


# The members as module constants: reading one off its Enum class costs a class attribute
# lookup through the enum machinery (hundreds of ns on 3.11), on every send group.
_UNASKED, _HELD = Copies.UNASKED, Copies.HELD
_LATE, _FAILED = Flush.LATE, Flush.FAILED
_PUT_OK, _NOT_MASTER, _LEASE_EXPIRED = Outcome.PUT_OK, Outcome.NOT_MASTER, Outcome.MASTER_LEASE_EXPIRED
_TOO_FEW, _DISK_FAILED = Outcome.IN_SYNC_REPLICAS_NOT_ENOUGH, Outcome.FLUSH_DISK_FAILED
_DISK_TIMEOUT, _SLAVE_TIMEOUT = Outcome.FLUSH_DISK_TIMEOUT, Outcome.FLUSH_SLAVE_TIMEOUT


def verdict(master: bool, lease: bool, in_sync: int, floor: int, copies: Copies,
            flush: Flush) -> Outcome:
    """The answer a write gets from these facts (see the module docstring)."""
    if copies == _UNASKED:
        if not master:
            return _NOT_MASTER
        if not lease:
            return _LEASE_EXPIRED
        if in_sync < floor:
            return _TOO_FEW
        return _PUT_OK
    if flush == _FAILED:
        return _DISK_FAILED
    if flush == _LATE:
        return _DISK_TIMEOUT
    if copies != _HELD or not master or not lease:
        return _SLAVE_TIMEOUT
    return _PUT_OK


def answer(outcome: Outcome) -> tuple[int, str]:
    """(response code, put status) of ``outcome``."""
    return ANSWERS[outcome]
