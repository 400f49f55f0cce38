# cython: language_level=3
"""Compiled twin of the message index's hot path (see ``message_index_py.py``, which is the
specification: same arguments, same results, same bytes in the index file)."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

cdef enum:
    MAX_KEYS = 64  # keys of one record indexed at most (the unique id counts as one)

HEADER_SIZE = 128
ENTRY_SIZE = 24
MAGIC_V1 = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
REC_FIXED = 91

DONE = 0
FULL = 1
NOT_A_RECORD = 2
BLANK = 3

cdef uint32_t _CRC_TABLE[256]


cdef void _crc_init():
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = <uint32_t>i
        for k in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        _CRC_TABLE[i] = c


_crc_init()


cdef inline uint32_t _crc(uint32_t crc, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t c = ~crc
    cdef Py_ssize_t i
    for i in range(n):
        c = _CRC_TABLE[(c ^ p[i]) & 0xFF] ^ (c >> 8)
    return ~c


cdef inline uint32_t _get32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _get64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_get32(p) << 32) | _get32(p + 4)


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


cdef inline void _put64(uint8_t* p, uint64_t v) noexcept nogil:
    _put32(p, <uint32_t>(v >> 32))
    _put32(p + 4, <uint32_t>v)


cdef inline bint _same(const uint8_t* a, const uint8_t* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


cdef Py_ssize_t _prop(const uint8_t* props, Py_ssize_t n, const char* needle, Py_ssize_t nlen,
                      Py_ssize_t* vlen) noexcept nogil:
    """Start of the value of property ``needle`` (``name\\x01``) or -1; its length in vlen."""
    cdef Py_ssize_t at = 0, j, start
    while at + nlen <= n:
        j = 0
        while j < nlen and props[at + j] == <uint8_t>needle[j]:
            j += 1
        if j == nlen and (at == 0 or props[at - 1] == 0x02):
            start = at + nlen
            j = start
            while j < n and props[j] != 0x02:
                j += 1
            vlen[0] = j - start
            return start
        at += 1
    return -1


def prop(bytes props, bytes needle):
    cdef Py_ssize_t vlen = 0
    cdef Py_ssize_t at = _prop(<const uint8_t*><char*>props, len(props), needle, len(needle), &vlen)
    if at < 0:
        return None
    return props[at:at + vlen]


def add_records(object view, Py_ssize_t pos, Py_ssize_t end, int64_t base, object mm,
                uint32_t slot_count, Py_ssize_t entries_at, uint32_t capacity, uint32_t count,
                int64_t min_ts, int64_t max_ts, tuple skip, Py_ssize_t max_key_bytes):
    cdef Py_buffer src, dst
    cdef const uint8_t* v
    cdef uint8_t* m
    cdef Py_ssize_t key_at[MAX_KEYS]
    cdef Py_ssize_t key_len[MAX_KEYS]
    cdef int nkeys, i, j, dup
    cdef Py_ssize_t t, p, topic_len, props_len, body_len, ulen, klen, kat, ws, total
    cdef uint32_t magic, h, prefix, s
    cdef int64_t ts, phys
    cdef Py_ssize_t added = 0
    cdef int status = DONE
    cdef bint first, skipped
    cdef bytes sk
    if slot_count == 0:
        raise ValueError("slot_count must be positive")
    PyObject_GetBuffer(view, &src, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(mm, &dst, PyBUF_WRITABLE)
        try:
            if end > src.len:
                raise ValueError("end is past the view")
            if entries_at + <Py_ssize_t>capacity * 24 > dst.len or \
                    128 + <Py_ssize_t>slot_count * 4 > dst.len:
                raise ValueError("the index file mapping is smaller than its header says")
            v = <const uint8_t*>src.buf
            m = <uint8_t*>dst.buf
            while end - pos >= 8:
                total = <Py_ssize_t>(<int>_get32(v + pos))
                magic = _get32(v + pos + 4)
                if magic == 0xCBD43194:
                    if total <= 0 or total > end - pos:
                        status = BLANK
                        break
                    pos += total
                    continue
                if magic != 0xDAA320A7 or total < 91:
                    status = NOT_A_RECORD
                    break
                if total > end - pos:
                    break
                body_len = <Py_ssize_t>(<int>_get32(v + pos + 84))
                t = pos + 88 + body_len
                if body_len < 0 or t + 3 > pos + total:
                    status = NOT_A_RECORD
                    break
                topic_len = v[t]
                if t + 3 + topic_len > pos + total:
                    status = NOT_A_RECORD
                    break
                props_len = (<Py_ssize_t>v[t + 1 + topic_len] << 8) | v[t + 2 + topic_len]
                p = t + 3 + topic_len
                if props_len == 0 or p + props_len > pos + total:
                    pos += total
                    continue
                skipped = False
                for sk in skip:
                    if len(sk) == topic_len and _same(<const uint8_t*><char*>sk, v + t + 1,
                                                      topic_len):
                        skipped = True
                        break
                if skipped:
                    pos += total
                    continue
                # Keys: UNIQ_KEY, then the KEYS words; no repeats, none empty or too long.
                nkeys = 0
                ulen = 0
                kat = _prop(v + p, props_len, b"UNIQ_KEY\x01", 9, &ulen)
                if kat >= 0 and ulen > 0:
                    key_at[0] = p + kat
                    key_len[0] = ulen
                    nkeys = 1
                klen = 0
                kat = _prop(v + p, props_len, b"KEYS\x01", 5, &klen)
                if kat >= 0 and klen > 0:
                    i = 0
                    ws = p + kat
                    while i <= klen:
                        if i == klen or v[p + kat + i] == 0x20:
                            if p + kat + i > ws and nkeys < MAX_KEYS:
                                key_at[nkeys] = ws
                                key_len[nkeys] = p + kat + i - ws
                                dup = 0
                                for j in range(nkeys):
                                    if key_len[j] == key_len[nkeys] and \
                                            _same(v + key_at[j], v + ws, key_len[j]):
                                        dup = 1
                                        break
                                if not dup:
                                    nkeys += 1
                            ws = p + kat + i + 1
                        i += 1
                j = 0
                for i in range(nkeys):
                    if key_len[i] <= max_key_bytes:
                        key_at[j] = key_at[i]
                        key_len[j] = key_len[i]
                        j += 1
                nkeys = j
                if nkeys == 0:
                    pos += total
                    continue
                if count + <uint32_t>nkeys > capacity and count:
                    status = FULL
                    break
                ts = <int64_t>_get64(v + pos + 56)
                phys = base + pos
                prefix = _crc(_crc(0, v + t + 1, topic_len), <const uint8_t*>b"#", 1)
                first = count == 0
                for i in range(nkeys):
                    if count >= capacity:
                        break
                    h = _crc(prefix, v + key_at[i], key_len[i])
                    s = 128 + 4 * (h % slot_count)
                    ws = entries_at + <Py_ssize_t>count * 24
                    _put64(m + ws, <uint64_t>phys)
                    _put64(m + ws + 8, <uint64_t>ts)
                    _put32(m + ws + 16, h)
                    _put32(m + ws + 20, _get32(m + s))
                    count += 1
                    added += 1
                    _put32(m + s, count)
                if first or ts < min_ts:
                    min_ts = ts
                if ts > max_ts:
                    max_ts = ts
                pos += total
        finally:
            PyBuffer_Release(&dst)
    finally:
        PyBuffer_Release(&src)
    return pos, count, min_ts, max_ts, added, status

