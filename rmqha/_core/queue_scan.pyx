# cython: language_level=3
"""The commitlog walk behind the consume-queue index, compiled twin (same API and results
as ``queue_scan_py.py``, where the layout of a run is documented).

One C loop reads each record's fields and appends its RocketMQ ConsumeQueue unit to the
current run's C buffer; a Python object is made per run (its bytes) and per TAGS value
that is not ASCII, not per record.
"""
from cpython.buffer cimport PyBuffer_Release, PyObject_GetBuffer, PyBUF_SIMPLE, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
FIXED_SIZE = 91

UNIT_SIZE = 20

cdef enum:
    C_FIXED = 91
    C_UNIT = 20

cdef uint32_t C_MESSAGE_MAGIC = 0xDAA320A7u
cdef uint32_t C_BLANK_MAGIC = 0xCBD43194u


cdef inline uint32_t _get32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _get64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_get32(p) << 32) | _get32(p + 4)


cdef inline Py_ssize_t _layout(const unsigned char* r, Py_ssize_t total, Py_ssize_t* blen,
                               Py_ssize_t* tlen) noexcept nogil:
    """The body and topic lengths of the record at ``r`` (``total`` bytes, all readable)
    into ``blen``/``tlen``, and its properties' length; -1 when they do not add up to it."""
    cdef Py_ssize_t plen
    blen[0] = <int32_t>_get32(r + 84)
    tlen[0] = r[88 + blen[0]] if 0 <= blen[0] <= total - C_FIXED else 0
    if not tlen[0] or C_FIXED + blen[0] + tlen[0] > total:
        return -1
    plen = (<Py_ssize_t>r[89 + blen[0] + tlen[0]] << 8) | r[90 + blen[0] + tlen[0]]
    return plen if C_FIXED + blen[0] + tlen[0] + plen == total else -1


cdef struct _Units:
    unsigned char* buf
    Py_ssize_t len   # units held
    Py_ssize_t cap   # units allocated


cdef inline void _put64(unsigned char* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = <unsigned char>(v >> (56 - 8 * i))


cdef int _push(_Units* a, int64_t phys, int32_t size, int64_t tag) except -1:
    # One RocketMQ ConsumeQueue unit, big-endian: offset int64, size int32, tag hash int64.
    cdef Py_ssize_t cap
    cdef void* p
    cdef unsigned char* u
    if a.len == a.cap:
        cap = 64 if a.cap == 0 else a.cap * 2
        p = realloc(a.buf, cap * C_UNIT)
        if p == NULL:
            raise MemoryError()
        a.buf = <unsigned char*>p
        a.cap = cap
    u = a.buf + a.len * C_UNIT
    _put64(u, <uint64_t>phys)
    u[8] = <unsigned char>(<uint32_t>size >> 24)
    u[9] = <unsigned char>(<uint32_t>size >> 16)
    u[10] = <unsigned char>(<uint32_t>size >> 8)
    u[11] = <unsigned char><uint32_t>size
    _put64(u + 12, <uint64_t>tag)
    a.len += 1
    return 0


cdef inline Py_ssize_t _find(const unsigned char* h, Py_ssize_t n, const unsigned char* needle,
                             Py_ssize_t m, Py_ssize_t start) noexcept nogil:
    cdef Py_ssize_t i
    if m == 0:
        return start
    i = start
    while i + m <= n:
        if h[i] == needle[0] and memcmp(h + i, needle, <size_t>m) == 0:
            return i
        i += 1
    return -1


def java_hash_ascii(bytes raw):
    """Java ``String.hashCode`` of an ASCII tag; None when it is not ASCII."""
    cdef const unsigned char* p = <const unsigned char*><char*>raw
    cdef Py_ssize_t i, n = len(raw)
    cdef uint32_t h = 0
    for i in range(n):
        if p[i] & 0x80:
            return None
        h = 31 * h + p[i]
    return <int32_t>h


cdef object _tag(const unsigned char* props, Py_ssize_t plen, object tag_hash):
    # TAGS's value as in queue_scan_py._tag_value, hashed; 0 for none or empty.
    cdef Py_ssize_t at = 0, start, end, i
    cdef uint32_t h = 0
    cdef bint ascii = True
    while True:
        at = _find(props, plen, <const unsigned char*>b"TAGS\x01", 5, at)
        if at < 0:
            return 0
        if at == 0 or props[at - 1] == 2:
            break
        at += 1
    start = at + 5
    end = start
    while end < plen and props[end] != 2:
        end += 1
    if end == start:
        return 0
    for i in range(start, end):
        if props[i] & 0x80:
            ascii = False
            break
        h = 31 * h + props[i]
    if ascii:
        return <int32_t>h
    return tag_hash(PyBytes_FromStringAndSize(<const char*>props + start, end - start))


def index_runs(object view, int64_t base, frozenset watched_topics, object watched_prop,
               object tag_hash):
    """Walk the whole records of ``view`` (global offset ``base``); returns ``(bytes
    consumed, runs, bad)`` (see ``queue_scan_py.index_runs``)."""
    cdef Py_buffer buf
    cdef const unsigned char* b
    cdef const unsigned char* props
    cdef const unsigned char* wp = NULL
    cdef Py_ssize_t n, pos = 0, total, blen, tlen, plen, t, wlen = 0
    cdef Py_ssize_t cur_t = -1, cur_tlen = 0
    cdef uint32_t magic
    cdef int32_t queue_id, cur_qid = 0
    cdef int64_t qoff, first = 0, last = 0, tag
    cdef _Units a
    cdef list runs = []
    cdef list hits = []
    cdef object topic = None
    cdef object bad = None
    cdef bint watch_topics = len(watched_topics) > 0
    cdef bint hit
    a.buf = NULL
    a.len = 0
    a.cap = 0
    if watched_prop is not None:
        wp = <const unsigned char*><char*><bytes>watched_prop
        wlen = len(<bytes>watched_prop)
    PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>buf.buf
        n = buf.len
        while n - pos >= 8:
            total = <int32_t>_get32(b + pos)
            magic = _get32(b + pos + 4)
            if magic == C_BLANK_MAGIC:
                if total <= 0 or total > n - pos:
                    break
                pos += total
                continue
            if magic != C_MESSAGE_MAGIC or total < C_FIXED:
                bad = (pos, magic, total)
                break
            if total > n - pos:
                break
            plen = _layout(b + pos, total, &blen, &tlen)
            if plen < 0:
                bad = (pos, magic, total)
                break
            queue_id = <int32_t>_get32(b + pos + 12)
            qoff = <int64_t>_get64(b + pos + 20)
            t = pos + 89 + blen
            props = b + t + tlen + 2
            tag = 0
            if plen:
                tag = _tag(props, plen, tag_hash)
            # Runs of one queue are the norm: only compare the topic bytes on each record.
            if (topic is None or queue_id != cur_qid or tlen != cur_tlen or qoff != last + 1
                    or memcmp(b + cur_t, b + t, <size_t>tlen) != 0):
                if topic is not None:
                    runs.append(_run(topic, cur_qid, first, &a, hits))
                    hits = []
                topic = PyBytes_FromStringAndSize(<const char*>b + t, tlen)
                cur_qid = queue_id
                cur_tlen = tlen
                first = qoff
                a.len = 0
            cur_t = t
            hit = False
            if watch_topics and topic in watched_topics:
                hit = True
            elif wp != NULL and plen and _find(props, plen, wp, wlen, 0) >= 0:
                hit = True
            if hit:
                hits.append(a.len)
            _push(&a, base + pos, <int32_t>total, tag)
            last = qoff
            pos += total
        if topic is not None:
            runs.append(_run(topic, cur_qid, first, &a, hits))
    finally:
        PyBuffer_Release(&buf)
        free(a.buf)
    return pos, runs, bad


cdef tuple _run(object topic, int32_t queue_id, int64_t first, _Units* a, list hits):
    return (topic, queue_id, first,
            PyBytes_FromStringAndSize(<const char*>a.buf, a.len * C_UNIT), hits)


def check_units(object view, int64_t base, bytes units, Py_ssize_t start, Py_ssize_t stop,
                int64_t first_qoff, int32_t queue_id, bytes topic):
    """Check units against the records they point at (see ``queue_scan_py.check_units``);
    returns ``(first unit not checked, whether it failed)``."""
    cdef Py_buffer buf
    cdef const unsigned char* b
    cdef const unsigned char* u = <const unsigned char*><char*>units
    cdef const unsigned char* t = <const unsigned char*><char*>topic
    cdef Py_ssize_t n, i, tlen = len(topic)
    cdef int64_t phys, rel, blen
    cdef int32_t size
    if start < 0 or stop * C_UNIT > len(units) or start > stop:
        raise ValueError("unit range outside the units given")
    PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>buf.buf
        n = buf.len
        for i in range(start, stop):
            phys = <int64_t>_get64(u + i * C_UNIT)
            size = <int32_t>_get32(u + i * C_UNIT + 8)
            rel = phys - base
            if rel < 0:
                return i, True
            if rel + size > n:
                return i, False
            if size < C_FIXED:
                return i, True
            blen = <int32_t>_get32(b + rel + 84)
            if (_get32(b + rel + 4) != C_MESSAGE_MAGIC or <int32_t>_get32(b + rel) != size
                    or <int32_t>_get32(b + rel + 12) != queue_id
                    or <int64_t>_get64(b + rel + 20) != first_qoff + i
                    or blen < 0 or blen > size - C_FIXED):
                return i, True
            if (b[rel + 88 + blen] != tlen or C_FIXED + blen + tlen > size
                    or memcmp(b + rel + 89 + blen, t, <size_t>tlen) != 0):
                return i, True
        return stop, False
    finally:
        PyBuffer_Release(&buf)


cdef class QueueSink:
    """Where :func:`dispatch` writes one queue's next units (see
    ``queue_scan_py.QueueSink``)."""

    cdef public object key
    cdef public bytes topic
    cdef public int queue_id
    cdef public object mm
    cdef public long long start
    cdef public long long next
    cdef public long long limit
    cdef public long long gen

    def __init__(self, object key, bytes topic, int queue_id):
        self.key = key
        self.topic = topic
        self.queue_id = queue_id
        self.mm = None
        self.start = 0
        self.next = 0
        self.limit = 0
        self.gen = 0


cdef bint _write_unit(QueueSink sink, int64_t qoff, int64_t phys, int32_t size, int64_t tag):
    # False when the sink's mapping cannot take the unit (closed since it was armed).
    cdef Py_buffer out
    cdef Py_ssize_t at = <Py_ssize_t>((qoff - sink.start) * C_UNIT)
    cdef unsigned char* u
    try:
        PyObject_GetBuffer(sink.mm, &out, PyBUF_WRITABLE)
    except (TypeError, ValueError, BufferError):
        return False
    try:
        if at < 0 or at + C_UNIT > out.len:
            return False
        u = <unsigned char*>out.buf + at
        _put64(u, <uint64_t>phys)
        u[8] = <unsigned char>(<uint32_t>size >> 24)
        u[9] = <unsigned char>(<uint32_t>size >> 16)
        u[10] = <unsigned char>(<uint32_t>size >> 8)
        u[11] = <unsigned char><uint32_t>size
        _put64(u + 12, <uint64_t>tag)
        return True
    finally:
        PyBuffer_Release(&out)


def dispatch(object view, int64_t base, dict sinks, frozenset watched_topics,
             object watched_prop, object tag_hash, int64_t gen):
    """Write each whole record's unit straight into its queue's file; returns ``(bytes
    consumed, records written, the keys of the sinks written)`` (see
    ``queue_scan_py.dispatch``)."""
    cdef Py_buffer buf
    cdef const unsigned char* b
    cdef const unsigned char* props
    cdef const unsigned char* wp = NULL
    cdef Py_ssize_t n, pos = 0, total, blen, tlen, plen, t, wlen = 0, count = 0
    cdef uint32_t magic
    cdef int32_t queue_id
    cdef int64_t qoff, tag
    cdef list grown = []
    cdef object topic
    cdef object found
    cdef QueueSink sink = None
    if watched_prop is not None:
        wp = <const unsigned char*><char*><bytes>watched_prop
        wlen = len(<bytes>watched_prop)
    PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>buf.buf
        n = buf.len
        while n - pos >= 8:
            total = <int32_t>_get32(b + pos)
            magic = _get32(b + pos + 4)
            if magic != C_MESSAGE_MAGIC or total < C_FIXED or total > n - pos:
                break
            plen = _layout(b + pos, total, &blen, &tlen)
            if plen < 0:
                break
            queue_id = <int32_t>_get32(b + pos + 12)
            qoff = <int64_t>_get64(b + pos + 20)
            t = pos + 89 + blen
            props = b + t + tlen + 2
            if wp != NULL and plen and _find(props, plen, wp, wlen, 0) >= 0:
                break
            # Consecutive records of one queue are the norm: its sink is kept, and only a
            # record of another queue makes a key (a watched topic never has one taken).
            if (sink is None or queue_id != sink.queue_id or tlen != len(sink.topic)
                    or memcmp(b + t, <const char*>sink.topic, <size_t>tlen) != 0):
                topic = PyBytes_FromStringAndSize(<const char*>b + t, tlen)
                if topic in watched_topics:
                    break
                found = sinks.get((topic, queue_id))
                if found is None:
                    break
                sink = <QueueSink?>found
            if qoff != sink.next or qoff >= sink.limit:
                break
            tag = 0
            if plen:
                tag = _tag(props, plen, tag_hash)
            if not _write_unit(sink, qoff, base + pos, <int32_t>total, tag):
                break
            sink.next = qoff + 1
            if sink.gen != gen:
                sink.gen = gen
                grown.append(sink.key)
            count += 1
            pos += total
    finally:
        PyBuffer_Release(&buf)
    return pos, count, grown
