# cython: language_level=3
"""Compiled twin of batch limiting and the confirm offset (hot paths; ARCHITECTURE.md lists them).

Same API and results as ``rmqha._core.ha_offsets_py`` (its docstring holds the decisions on
RocketMQ's behaviour).  A compiled epoch map is searched in C; any other map (the pure twin,
or a public EpochMap over it) goes through its Python methods.
"""
from libc.stdint cimport int64_t

from rmqha._core.epoch_map cimport EpochMapCore
from rmqha._core.ha_offsets_py import DEFAULT_MAX_BATCH, DEFAULT_MAX_LAG_MS, _epoch_of


def limit_batch(epoch_map, from_offset, want, segment_end, max_batch=DEFAULT_MAX_BATCH):
    """(epoch, epoch_start, size) of the next transfer batch starting at ``from_offset``."""
    cdef int64_t f = from_offset, w = want, seg = segment_end, mb = max_batch
    cdef int64_t size, end, epoch, start
    cdef Py_ssize_t i
    cdef EpochMapCore core
    if f < 0:
        raise ValueError(f"from_offset {f} is negative")
    if w < 0:
        raise ValueError(f"want {w} is negative")
    if mb <= 0:
        raise ValueError(f"max_batch {mb} must be positive")
    if seg < f:
        raise ValueError(f"segment_end {seg} is before from_offset {f}")
    obj = getattr(epoch_map, "_core", epoch_map)
    if type(obj) is EpochMapCore:
        core = <EpochMapCore> obj
        i = core._find_offset(f)
        if i < 0:
            # Same message as the pure twin: let the generic path raise it.
            _epoch_of(epoch_map, from_offset)
        epoch = core._epochs[i]
        start = core._starts[i]
        end = core._starts[i + 1] if i + 1 < core._n else -1
    else:
        epoch, start, end = _epoch_of(epoch_map, from_offset)
    size = w if w < mb else mb
    if seg - f < size:
        size = seg - f
    if end >= 0 and end - f < size:
        size = end - f
    return epoch, start, size


def confirm_offset(master_max, acks, previous):
    """min(master_max, acks) over the other SyncStateSet members; ``previous`` if one is absent."""
    cdef int64_t c = master_max, a
    for item in acks:
        if item is None:
            return previous
        a = item
        if a < 0:
            return previous
        if a < c:
            c = a
    return c


def should_expand(ack, confirm, epoch_start):
    """A slave joins the SyncStateSet once its ack reached the confirm offset and the epoch start."""
    cdef int64_t a = ack
    return a >= 0 and a >= <int64_t> confirm and a >= <int64_t> epoch_start


def should_shrink(now_ms, last_caught_up_ms, max_lag_ms=DEFAULT_MAX_LAG_MS):
    """A slave leaves the SyncStateSet when it has not caught up for more than ``max_lag_ms``."""
    cdef int64_t now = now_ms, last = last_caught_up_ms, lag = max_lag_ms
    return now - last > lag
