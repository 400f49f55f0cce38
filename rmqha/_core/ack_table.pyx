# cython: language_level=3
"""Compiled twin of the HA master's waiting sends (``rmqha._core.ack_table_py`` holds the rules).

Same API and answers as the pure twin.  A queue keeps its offsets and deadlines in C arrays
from a head index (a release takes a prefix: the head moves, the arrays are compacted only
when half of them is dead), and the callables in a list beside them; so an ack that
releases a send costs one C search and the callable's call, no Python object per field.
"""
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memmove

from rmqha._core.ack_table_py import NO_DEADLINE


cdef inline int64_t _point(list acks, object need, int64_t floor, int64_t max_offset) except? -2:
    cdef Py_ssize_t n = len(acks), i, j, others
    cdef int64_t point, a
    cdef int64_t top[8]
    if need is None:
        if floor > 1 and n + 1 < floor:
            return -1
        if n == 0:
            point = max_offset
        else:
            point = acks[0]
            for i in range(1, n):
                a = acks[i]
                if a < point:
                    point = a
    else:
        others = need
        if floor > others:
            others = floor
        others -= 1
        if others <= 0:
            point = max_offset
        elif others > n:
            return -1
        elif n <= 8:
            # The others-th largest ack: an insertion sort of a handful of members.
            for i in range(n):
                a = acks[i]
                j = i
                while j > 0 and top[j - 1] < a:
                    top[j] = top[j - 1]
                    j -= 1
                top[j] = a
            point = top[others - 1]
        else:
            point = sorted(acks, reverse=True)[others - 1]
    if point < 0:
        return -1
    return point if point < max_offset else max_offset


def reach_point(acks, need, floor, max_offset):
    """The highest offset with the copies ``need`` asks for (and at least ``floor``), -1
    when no offset has them."""
    return _point(list(acks), need, floor, max_offset)


cdef class WaiterQueue:
    """The waiters of one ``need``, lowest offset first."""

    cdef int64_t *_offsets
    cdef double *_deadlines
    cdef list _dones
    cdef Py_ssize_t _head, _n, _cap

    def __cinit__(self):
        self._offsets = NULL
        self._deadlines = NULL
        self._dones = []
        self._head = 0
        self._n = 0
        self._cap = 0

    def __dealloc__(self):
        PyMem_Free(self._offsets)
        PyMem_Free(self._deadlines)

    def __len__(self):
        return self._n - self._head

    cdef int _room(self) except -1:
        cdef Py_ssize_t live = self._n - self._head, cap
        cdef void *p
        if self._head and (self._n == self._cap or self._head * 2 >= self._n):
            memmove(self._offsets, self._offsets + self._head, live * sizeof(int64_t))
            memmove(self._deadlines, self._deadlines + self._head, live * sizeof(double))
            del self._dones[:self._head]
            self._head = 0
            self._n = live
        if self._n < self._cap:
            return 0
        cap = self._cap * 2 if self._cap else 16
        p = PyMem_Realloc(self._offsets, cap * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        self._offsets = <int64_t *> p
        p = PyMem_Realloc(self._deadlines, cap * sizeof(double))
        if p == NULL:
            raise MemoryError()
        self._deadlines = <double *> p
        self._cap = cap
        return 0

    def add(self, offset, deadline, done):
        """A waiter for ``offset``, answered False at ``deadline`` if not released before."""
        cdef int64_t o = offset
        cdef double d = deadline
        cdef Py_ssize_t i
        self._room()
        i = self._n
        if i > self._head and self._offsets[i - 1] > o:
            # Out of log order (rare): after every waiter of an offset up to ``o``.
            i = self._after(o)
            memmove(self._offsets + i + 1, self._offsets + i, (self._n - i) * sizeof(int64_t))
            memmove(self._deadlines + i + 1, self._deadlines + i, (self._n - i) * sizeof(double))
            self._dones.insert(i, done)
        else:
            self._dones.append(done)
        self._offsets[i] = o
        self._deadlines[i] = d
        self._n += 1

    cdef Py_ssize_t _after(self, int64_t point):
        """The first index from the head whose offset is above ``point``."""
        cdef Py_ssize_t lo = self._head, hi = self._n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._offsets[mid] <= point:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def next_deadline(self):
        """The earliest deadline of a waiter here (``NO_DEADLINE`` when empty)."""
        cdef Py_ssize_t i
        cdef double best
        if self._n == self._head:
            return NO_DEADLINE
        best = self._deadlines[self._head]
        for i in range(self._head + 1, self._n):
            if self._deadlines[i] < best:
                best = self._deadlines[i]
        return best

    cdef Py_ssize_t _release(self, int64_t point, object on_error) except -1:
        cdef Py_ssize_t i, k, head = self._head
        cdef list dones
        if point < 0 or self._n == head or self._offsets[head] > point:
            return 0
        k = self._after(point)
        dones = self._dones[head:k]
        for i in range(head, k):
            self._dones[i] = None
        self._head = k
        if k == self._n:
            self._head = self._n = 0
            del self._dones[:]
        _answer(dones, True, on_error)
        return k - head

    def release(self, point, on_error):
        """Answer True every waiter whose offset is at most ``point``; how many."""
        return self._release(point, on_error)

    def expire(self, now, on_error):
        """Answer False every waiter whose deadline is at most ``now``; how many."""
        cdef double t = now
        cdef Py_ssize_t i, w
        cdef list dead = []
        cdef list keep = []
        for i in range(self._head, self._n):
            if self._deadlines[i] <= t:
                dead.append(self._dones[i])
        if not dead:
            return 0
        w = 0
        for i in range(self._head, self._n):
            if self._deadlines[i] > t:
                self._offsets[w] = self._offsets[i]
                self._deadlines[w] = self._deadlines[i]
                keep.append(self._dones[i])
                w += 1
        self._dones = keep
        self._head = 0
        self._n = w
        _answer(dead, False, on_error)
        return len(dead)

    def fail_all(self, on_error):
        """Answer False every waiter; how many."""
        dones = self._dones[self._head:self._n]
        self._dones = []
        self._head = self._n = 0
        _answer(dones, False, on_error)
        return len(dones)


def settle(queues, acks, floor, max_offset, on_error):
    """Release every queue up to its need's reach point; how many waiters were answered."""
    cdef list a = list(acks)
    cdef int64_t f = floor, mx = max_offset
    cdef Py_ssize_t released = 0
    cdef WaiterQueue q
    for need, queue in list(queues.items()):
        q = <WaiterQueue?> queue
        if q._n > q._head:
            released += q._release(_point(a, need, f, mx), on_error)
    return released


cdef void _answer(list dones, bint ok, object on_error) except *:
    for done in dones:
        try:
            done(ok)
        except Exception as exc:  # one send's answer must not stop the others
            on_error(exc)

