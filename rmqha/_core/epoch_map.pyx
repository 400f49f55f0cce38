# cython: language_level=3
"""Compiled twin of the in-memory epoch map (a hot path; ARCHITECTURE.md lists them).

Same API and results as ``rmqha._core.epoch_map_py`` (see its docstring for the model and
the RocketMQ quirks decided there).  Entries live in two C arrays so lookups, the
consistent-point search between two compiled maps and batch limiting run as C loops.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int64_t

from rmqha.errors import EpochError

#: End of the last entry while the log's max offset is not known (Java Long.MAX_VALUE).
OPEN_END = (1 << 63) - 1
#: Epochs travel as int32 in both HA dialects.
MAX_EPOCH = (1 << 31) - 1

cdef int64_t C_OPEN_END = 0x7FFFFFFFFFFFFFFF
cdef int64_t C_MAX_EPOCH = 0x7FFFFFFF


cdef int64_t _as_int64(object value, str what) except? -1:
    try:
        return value
    except OverflowError:
        raise EpochError(f"{what} {value} does not fit in a signed 64-bit integer") from None


cdef class EpochMapCore:
    """Ordered epoch entries with strictly increasing epochs and increasing starts."""

    def __cinit__(self):
        self._epochs = NULL
        self._starts = NULL
        self._n = 0
        self._cap = 0
        self._max_offset = C_OPEN_END

    def __init__(self, entries=()):
        for item in entries:
            self.append(item[0], item[1])

    def __dealloc__(self):
        PyMem_Free(self._epochs)
        PyMem_Free(self._starts)

    cdef int _reserve(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        cdef int64_t *e
        cdef int64_t *s
        if need <= self._cap:
            return 0
        cap = self._cap * 2 if self._cap else 8
        while cap < need:
            cap *= 2
        e = <int64_t *> PyMem_Realloc(self._epochs, cap * sizeof(int64_t))
        if e == NULL:
            raise MemoryError()
        self._epochs = e
        s = <int64_t *> PyMem_Realloc(self._starts, cap * sizeof(int64_t))
        if s == NULL:
            raise MemoryError()
        self._starts = s
        self._cap = cap
        return 0

    cdef inline int64_t _end(self, Py_ssize_t i) noexcept:
        return self._starts[i + 1] if i + 1 < self._n else self._max_offset

    cdef Py_ssize_t _find_epoch(self, int64_t epoch) noexcept:
        cdef Py_ssize_t lo = 0, hi = self._n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._epochs[mid] < epoch:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef Py_ssize_t _find_offset(self, int64_t offset) noexcept:
        cdef Py_ssize_t lo = 0, hi = self._n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._starts[mid] <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    cdef tuple _entry(self, Py_ssize_t i):
        return (self._epochs[i], self._starts[i], self._end(i))

    # --- queries ---------------------------------------------------------------------------

    def __len__(self):
        return self._n

    def __repr__(self):
        return f"EpochMapCore({self.entries()!r})"

    @property
    def max_offset(self):
        """The caller-given end of the last entry; OPEN_END while unknown."""
        return self._max_offset

    def entries(self):
        cdef Py_ssize_t i
        return [self._entry(i) for i in range(self._n)]

    def pairs(self):
        cdef Py_ssize_t i
        return [(self._epochs[i], self._starts[i]) for i in range(self._n)]

    def last_epoch(self):
        return self._epochs[self._n - 1] if self._n else -1

    def first_entry(self):
        return self._entry(0) if self._n else None

    def last_entry(self):
        return self._entry(self._n - 1) if self._n else None

    def entry_for_epoch(self, epoch):
        cdef int64_t e = _as_int64(epoch, "epoch")
        cdef Py_ssize_t i = self._find_epoch(e)
        if i < self._n and self._epochs[i] == e:
            return self._entry(i)
        return None

    def next_entry(self, epoch):
        """The entry with the smallest epoch greater than ``epoch`` (RocketMQ ceiling(e+1))."""
        cdef int64_t e = _as_int64(epoch, "epoch")
        cdef Py_ssize_t i
        if e == C_OPEN_END:
            return None
        i = self._find_epoch(e + 1)
        return self._entry(i) if i < self._n else None

    def entry_for_offset(self, offset):
        """The entry with start <= offset < end, None if no entry holds the offset."""
        cdef int64_t o = _as_int64(offset, "offset")
        cdef Py_ssize_t i = self._find_offset(o)
        if i >= 0 and o < self._end(i):
            return self._entry(i)
        return None

    def find_consistent_point(self, remote):
        """Newest local entry the remote also has (same epoch, same start) -> min of the ends.

        ``remote`` is another map (either twin, or the public EpochMap) or a sequence of
        (epoch, start, end) triples whose last end is the remote max offset.  -1 when the
        histories share no entry.
        """
        cdef EpochMapCore other
        cdef int64_t *re
        cdef int64_t *rs
        cdef int64_t *rend
        cdef Py_ssize_t n
        core = getattr(remote, "_core", remote)
        if isinstance(core, EpochMapCore):
            other = <EpochMapCore> core
            return self._consistent_point(other._epochs, other._starts, NULL, other._n, other._max_offset)
        entries = getattr(remote, "entries", None)
        items = entries() if callable(entries) else remote
        if type(items) is list or type(items) is tuple:
            # Triples as decoded from the wire: copy them to C arrays in one pass; the merge
            # walk needs strictly increasing epochs, so anything else takes the dict path.
            n = len(items)
            re = <int64_t *> PyMem_Malloc(3 * (n if n else 1) * sizeof(int64_t))
            if re == NULL:
                raise MemoryError()
            rs = re + n
            rend = rs + n
            try:
                if self._load_sorted_triples(items, re, rs, rend, n):
                    return self._consistent_point(re, rs, rend, n, 0)
            finally:
                PyMem_Free(re)
        # Any order, duplicates (a later one wins, as the pure twin's dict does), other types.
        by_epoch = {}
        for item in items:
            if len(item) != 3:
                raise EpochError(f"remote epoch entry {item!r} is not an (epoch, start, end) triple")
            by_epoch[int(item[0])] = (int(item[1]), int(item[2]))
        for i in range(self._n - 1, -1, -1):
            hit = by_epoch.get(self._epochs[i])
            if hit is not None and hit[0] == self._starts[i]:
                return min(self._end(i), hit[1])
        return -1

    cdef bint _load_sorted_triples(self, object items, int64_t *re, int64_t *rs, int64_t *rend,
                                   Py_ssize_t n) except -1:
        """Fill the arrays from (epoch, start, end) tuples; False if not strictly increasing."""
        cdef Py_ssize_t k
        cdef object item
        for k in range(n):
            item = items[k]
            if type(item) is not tuple or PyTuple_GET_SIZE(item) != 3:
                return False
            try:
                re[k] = <object> PyTuple_GET_ITEM(item, 0)
                rs[k] = <object> PyTuple_GET_ITEM(item, 1)
                rend[k] = <object> PyTuple_GET_ITEM(item, 2)
            except (OverflowError, TypeError):
                return False
            if k and re[k] <= re[k - 1]:
                return False
        return True

    cdef object _consistent_point(self, const int64_t *re, const int64_t *rs, const int64_t *rend,
                                  Py_ssize_t rn, int64_t rmax):
        """Merge walk from the newest entries of both sorted histories (C loop)."""
        cdef Py_ssize_t i = self._n - 1, j = rn - 1
        cdef int64_t end, other_end
        while i >= 0 and j >= 0:
            if re[j] > self._epochs[i]:
                j -= 1
            elif re[j] < self._epochs[i]:
                i -= 1
            elif rs[j] == self._starts[i]:
                end = self._end(i)
                if rend != NULL:
                    other_end = rend[j]
                else:
                    other_end = rs[j + 1] if j + 1 < rn else rmax
                return end if end < other_end else other_end
            else:
                i -= 1
                j -= 1
        return -1

    # --- mutations -------------------------------------------------------------------------

    cpdef append(self, epoch, start):
        """Add the entry of a new epoch; an equal start replaces the last entry."""
        cdef int64_t e = _as_int64(epoch, "epoch")
        cdef int64_t s = _as_int64(start, "start offset")
        cdef int64_t last_epoch, last_start
        if e < 0 or e > C_MAX_EPOCH:
            raise EpochError(f"epoch {e} is outside 0..{MAX_EPOCH}")
        if s < 0 or s >= C_OPEN_END:
            raise EpochError(f"start offset {s} of epoch {e} is outside 0..{OPEN_END - 1}")
        if self._n:
            last_epoch = self._epochs[self._n - 1]
            last_start = self._starts[self._n - 1]
            if e <= last_epoch:
                raise EpochError(
                    f"epoch {e} (start {s}) is not greater than the last epoch {last_epoch}"
                )
            if s < last_start:
                raise EpochError(
                    f"start offset {s} of epoch {e} is below the start {last_start} "
                    f"of the last epoch {last_epoch}"
                )
            if s == last_start:
                # The last epoch never held data: the new one takes its place.
                self._epochs[self._n - 1] = e
                return None
        self._reserve(self._n + 1)
        self._epochs[self._n] = e
        self._starts[self._n] = s
        self._n += 1
        return None

    def set_max_offset(self, offset):
        """Set the log's max offset (the last entry's end); None makes it open-ended again."""
        cdef int64_t o
        if offset is None:
            self._max_offset = C_OPEN_END
            return
        o = _as_int64(offset, "max offset")
        if o < 0:
            raise EpochError(f"max offset {o} is outside 0..{OPEN_END}")
        self._max_offset = o

    def truncate_suffix(self, offset):
        """Drop entries starting at or after ``offset``; the new last entry becomes open-ended."""
        cdef int64_t o
        cdef Py_ssize_t n = self._n, keep = self._n
        try:
            o = offset
        except OverflowError:
            o = C_OPEN_END if offset > 0 else -C_OPEN_END - 1
        while keep > 0 and self._starts[keep - 1] >= o:
            keep -= 1
        self._n = keep
        self._max_offset = C_OPEN_END
        return n - keep

    def truncate_suffix_by_epoch(self, epoch):
        """Drop entries whose epoch is >= ``epoch``; the new last entry becomes open-ended."""
        cdef int64_t e = _as_int64(epoch, "epoch")
        cdef Py_ssize_t n = self._n
        self._n = self._find_epoch(e)
        self._max_offset = C_OPEN_END
        return n - self._n

    def truncate_prefix(self, offset):
        """Drop entries that end at or before ``offset``; the newest entry is always kept."""
        cdef int64_t o
        cdef Py_ssize_t drop = 0, i
        try:
            o = offset
        except OverflowError:
            o = C_OPEN_END if offset > 0 else -C_OPEN_END - 1
        while drop + 1 < self._n and self._starts[drop + 1] <= o:
            drop += 1
        if drop:
            for i in range(self._n - drop):
                self._epochs[i] = self._epochs[i + drop]
                self._starts[i] = self._starts[i + drop]
            self._n -= drop
        return drop

    def clear(self):
        self._n = 0
        self._max_offset = C_OPEN_END

    def copy(self):
        cdef EpochMapCore other = EpochMapCore.__new__(EpochMapCore)
        cdef Py_ssize_t i
        other._reserve(self._n)
        for i in range(self._n):
            other._epochs[i] = self._epochs[i]
            other._starts[i] = self._starts[i]
        other._n = self._n
        other._max_offset = self._max_offset
        return other
