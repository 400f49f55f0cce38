# cython: language_level=3
"""The body of a pull answer, compiled twin (same API and results as ``pull_answer_py.py``,
where both ends are documented).

``assemble`` checks a run of consume-queue units against their records in one C loop
(the body CRC with the records codec's C code) and copies the records it takes into one
bytes object: no Python object per record unless a tag filter asks for the tag's hash.
``decode`` makes one message object per record and the field values it holds; a topic or
host repeated from the previous record is the same str object.
"""
from cpython.buffer cimport PyBuffer_Release, PyObject_GetBuffer, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

from rmqha._core.records cimport body_crc_c
from rmqha.errors import ProtocolError

MESSAGE_MAGIC = 0xDAA320A7
FIXED_SIZE = 91
UNIT_SIZE = 20
CRC_MASK = 0x7FFFFFFF
COMPRESSED = 0x1

DONE = 0
OUTSIDE = 1
MISMATCH = 2
BAD_RECORD = 3

cdef enum:
    C_FIXED = 91
    C_UNIT = 20
    C_DONE = 0
    C_OUTSIDE = 1
    C_MISMATCH = 2
    C_BAD_RECORD = 3

cdef uint32_t C_MESSAGE_MAGIC = 0xDAA320A7u


cdef inline uint32_t _get32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _get64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_get32(p) << 32) | _get32(p + 4)


cdef inline bint _unit_matches(const unsigned char* r, int32_t size, int64_t qoff,
                               int32_t queue_id, const unsigned char* topic,
                               Py_ssize_t tlen) noexcept nogil:
    # queue_scan.check_units's test of one unit (size >= C_FIXED, the record is in view).
    cdef int64_t blen = <int32_t>_get32(r + 84)
    if (_get32(r + 4) != C_MESSAGE_MAGIC or <int32_t>_get32(r) != size
            or <int32_t>_get32(r + 12) != queue_id or <int64_t>_get64(r + 20) != qoff
            or blen < 0 or blen > size - C_FIXED):
        return False
    return (r[88 + blen] == tlen and C_FIXED + blen + tlen <= size
            and memcmp(r + 89 + blen, topic, <size_t>tlen) == 0)


cdef inline bint _record_sound(const unsigned char* r, int32_t size,
                               int64_t phys) noexcept nogil:
    # records.scan's test of a record whose unit matched: lengths, offset field, body CRC.
    cdef int64_t blen = <int32_t>_get32(r + 84)
    cdef int64_t tlen = r[88 + blen]
    cdef int64_t plen
    if tlen == 0:
        return False
    plen = (<int64_t>r[89 + blen + tlen] << 8) | r[90 + blen + tlen]
    if C_FIXED + blen + tlen + plen != size or <int64_t>_get64(r + 28) != phys:
        return False
    return body_crc_c(r + 88, <size_t>blen) == _get32(r + 8)


def assemble(object view, int64_t base, bytes units, Py_ssize_t start, Py_ssize_t stop,
             int64_t first_qoff, int32_t queue_id, bytes topic, object hashes,
             int64_t max_bytes, int64_t total, Py_ssize_t taken):
    """Check units against their records and copy the ones the answer takes (see
    ``pull_answer_py.assemble``); returns ``(i, how, taken, total, records)``."""
    cdef Py_buffer buf
    cdef const unsigned char* b
    cdef const unsigned char* u
    cdef const unsigned char* t = <const unsigned char*><char*>topic
    cdef const unsigned char* rec
    cdef Py_ssize_t n, i, j, k = 0, tlen = len(topic)
    cdef int64_t phys, rel, out_len = 0
    cdef int32_t size
    cdef int how = C_DONE
    cdef bint open_ = taken >= start
    cdef bint filtered = hashes is not None
    cdef int64_t* picks
    cdef char* dst
    cdef bytes out
    if start < 0 or stop * C_UNIT > len(units) or start > stop:
        raise ValueError("unit range outside the units given")
    u = <const unsigned char*><char*>units
    # (position in view, size) of each record taken
    picks = <int64_t*>malloc(<size_t>(2 * (stop - start) + 1) * sizeof(int64_t))
    if picks == NULL:
        raise MemoryError()
    PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>buf.buf
        n = buf.len
        i = start
        while i < stop:
            phys = <int64_t>_get64(u + i * C_UNIT)
            size = <int32_t>_get32(u + i * C_UNIT + 8)
            rel = phys - base
            if rel < 0:
                how = C_MISMATCH
                break
            if rel + size > n:
                how = C_OUTSIDE
                break
            rec = b + rel
            if size < C_FIXED or not _unit_matches(rec, size, first_qoff + i, queue_id, t, tlen):
                how = C_MISMATCH
                break
            if open_:
                if total and total + size > max_bytes:
                    open_ = False
                elif filtered and <int64_t>_get64(u + i * C_UNIT + 12) not in hashes:
                    taken = i + 1
                elif not _record_sound(rec, size, phys):
                    how = C_BAD_RECORD
                    break
                else:
                    taken = i + 1
                    total += size
                    picks[2 * k] = rel
                    picks[2 * k + 1] = size
                    k += 1
                    out_len += size
            i += 1
        out = PyBytes_FromStringAndSize(NULL, out_len)
        dst = PyBytes_AS_STRING(out)
        for j in range(k):
            memcpy(dst, b + picks[2 * j], <size_t>picks[2 * j + 1])
            dst += picks[2 * j + 1]
    finally:
        PyBuffer_Release(&buf)
        free(picks)
    return i, how, taken, total, out


cdef dict _properties(const unsigned char* p, Py_ssize_t n):
    # RocketMQ's string2messageProperties: pairs split at \x02, each at its first \x01;
    # pairs with an empty key or value are skipped; UTF-8 with replacement (the separators
    # are ASCII, so decoding piece by piece reads as decoding the whole).
    cdef dict out = {}
    cdef Py_ssize_t i = 0, j, sep
    while i < n:
        j = i
        sep = -1
        while j < n and p[j] != 2:
            if sep < 0 and p[j] == 1:
                sep = j
            j += 1
        if sep > i and j > sep + 1:
            out[PyUnicode_DecodeUTF8(<const char*>p + i, sep - i, "replace")] = \
                PyUnicode_DecodeUTF8(<const char*>p + sep + 1, j - sep - 1, "replace")
        i = j + 1
    return out


cdef str _host(const unsigned char* h):
    # "a.b.c.d:port" of an IPv4 host field (4 address bytes, int32 port).
    cdef char text[32]
    snprintf(text, 32, "%u.%u.%u.%u:%d", h[0], h[1], h[2], h[3], <int32_t>_get32(h + 4))
    return text.decode("ascii")


def decode(object data, str broker_name, object make, object inflate, Py_ssize_t max_records):
    """Decode a pull body into ``make`` objects (see ``pull_answer_py.decode``)."""
    cdef Py_buffer buf
    cdef const unsigned char* b
    cdef const unsigned char* r
    cdef const unsigned char* last_topic = NULL
    cdef Py_ssize_t n, pos = 0, count = 0
    cdef int64_t total, blen, tlen, plen
    cdef uint32_t magic
    cdef int32_t sys_flag
    cdef int64_t phys
    cdef uint64_t born_key = 0, store_key = 0, key
    cdef str topic = None, born = None, store = None
    cdef object body, error, msg
    cdef dict d
    cdef list out = []
    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>buf.buf
        n = buf.len
        while pos < n:
            if n - pos < C_FIXED:
                raise ProtocolError(f"record at {pos}: {n - pos} bytes left, need {C_FIXED}")
            r = b + pos
            total = <int32_t>_get32(r)
            magic = _get32(r + 4)
            blen = <int32_t>_get32(r + 84)
            if magic != C_MESSAGE_MAGIC:
                raise ProtocolError(f"record at {pos}: magic {magic:#x} is not V1")
            if total < C_FIXED or total > n - pos or blen < 0 or blen > total - C_FIXED:
                raise ProtocolError(f"record at {pos}: bad sizes total={total} body={blen}")
            tlen = r[88 + blen]
            if C_FIXED + blen + tlen > total:
                raise ProtocolError(f"record at {pos}: topic runs past the record")
            plen = (<int64_t>r[89 + blen + tlen] << 8) | r[90 + blen + tlen]
            if C_FIXED + blen + tlen + plen != total:
                raise ProtocolError(f"record at {pos}: sizes do not add up to {total}")
            sys_flag = <int32_t>_get32(r + 36)
            phys = <int64_t>_get64(r + 28)
            body = PyBytes_FromStringAndSize(<const char*>r + 88, blen)
            error = None
            if sys_flag & 1:
                body, error = inflate(body, sys_flag, phys)
            if (last_topic == NULL or last_topic[0] != tlen
                    or memcmp(last_topic + 1, r + 89 + blen, <size_t>tlen) != 0):
                topic = PyUnicode_DecodeUTF8(<const char*>r + 89 + blen, tlen, "replace")
                last_topic = r + 88 + blen
            key = _get64(r + 48)
            if born is None or key != born_key:
                born, born_key = _host(r + 48), key
            key = _get64(r + 64)
            if store is None or key != store_key:
                store, store_key = _host(r + 64), key
            msg = make.__new__(make)
            d = msg.__dict__
            d["topic"] = topic
            d["queue_id"] = <int32_t>_get32(r + 12)
            d["queue_offset"] = <int64_t>_get64(r + 20)
            d["commit_offset"] = phys
            d["body"] = body
            d["properties"] = _properties(r + 91 + blen + tlen, plen)
            d["sys_flag"] = sys_flag
            d["flag"] = <int32_t>_get32(r + 16)
            d["born_timestamp"] = <int64_t>_get64(r + 40)
            d["store_timestamp"] = <int64_t>_get64(r + 56)
            d["born_host"] = born
            d["store_host"] = store
            d["reconsume_times"] = <int32_t>_get32(r + 72)
            d["broker_name"] = broker_name
            d["decompress_error"] = error
            out.append(msg)
            count += 1
            if count > max_records:
                raise ProtocolError(f"more than {max_records} records in one body")
            pos += total
    finally:
        PyBuffer_Release(&buf)
    return out
