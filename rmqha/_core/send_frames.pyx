# cython: language_level=3
"""Compiled twin of the broker's plain-send frames (what a plain send is, the fields of
:data:`SendFrame` and the answer's bytes: ``rmqha._core.send_frames_py``'s docstring).

Same API, results and bytes as the pure twin.  A read's frames are split, and a plain
send's header (JSON or binary) parsed, through raw pointers after explicit length checks,
without a command object or a header dict: the only objects made per plain send are its
tuple, its topic, properties, body and head (and with ``signed`` its access key, signature
and signed fields, written in one buffer from the header's entries sorted in place; the
body, which follows them in the signed content, is not copied behind them).
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t
from libc.string cimport memcpy
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc

from rmqha.errors import ProtocolError

SEND_MESSAGE = 10
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
COMPRESSED = 0x1
TRANSACTION_BITS = 0xC
LANGUAGE = "PYTHON"
LANGUAGE_CODE = 3
MAX_SIGNED_FIELDS = 64
V4_9_3 = 400

cdef enum:
    NFIELDS = 10
    F_TOPIC = 0
    F_QUEUE = 1
    F_SYSFLAG = 2
    F_BORN = 3
    F_FLAG = 4
    F_PROPS = 5
    F_RECONSUME = 6
    F_BATCH = 7
    F_MAXRT = 8
    F_GROUP = 9
    MAX_DIGITS = 18
    SMALL = 32
    NOT_PLAIN = -1
    MAXEXT = 64
    OLD_SIGNING = 400  # V4_9_3

cdef tuple _V1 = (b"topic", b"queueId", b"sysFlag", b"bornTimestamp", b"flag", b"properties",
                  b"reconsumeTimes", b"batch", b"maxReconsumeTimes", b"producerGroup")
cdef tuple _V2 = (b"b", b"e", b"f", b"g", b"h", b"i", b"j", b"m", b"l", b"a")
cdef tuple _TOP = (b"code", b"language", b"version", b"opaque", b"flag", b"remark",
                   b"extFields", b"serializeTypeCurrentRPC")


cdef inline uint32_t _be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline bint _ws(unsigned char c) noexcept nogil:
    return c == 0x20 or c == 0x09 or c == 0x0A or c == 0x0D


cdef Py_ssize_t _utf8_seq(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Length of the strict UTF-8 sequence at ``i`` (its lead byte >= 0x80), or -1."""
    cdef unsigned char c = p[i], c1
    cdef Py_ssize_t k, need
    if c < 0xC2 or c > 0xF4:
        return -1
    need = 2 if c < 0xE0 else (3 if c < 0xF0 else 4)
    if i + need > n:
        return -1
    c1 = p[i + 1]
    if (c1 & 0xC0) != 0x80:
        return -1
    if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F) or (c == 0xF0 and c1 < 0x90) \
            or (c == 0xF4 and c1 > 0x8F):
        return -1
    for k in range(2, need):
        if (p[i + k] & 0xC0) != 0x80:
            return -1
    return need


cdef bint _utf8_ok(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0, k
    while i < n:
        if p[i] < 0x80:
            i += 1
        else:
            k = _utf8_seq(p, i, n)
            if k < 0:
                return False
            i += k
    return True


cdef inline int _hex(unsigned char c) noexcept nogil:
    if 0x30 <= c <= 0x39:
        return c - 0x30
    if 0x61 <= c <= 0x66:
        return c - 0x61 + 10
    if 0x41 <= c <= 0x46:
        return c - 0x41 + 10
    return -1


cdef Py_ssize_t _jstr(const unsigned char* h, Py_ssize_t n, Py_ssize_t p, unsigned char* out,
                      Py_ssize_t cap, Py_ssize_t* outlen) noexcept nogil:
    """Past the JSON string at ``p`` (its quote), or NOT_PLAIN; its unescaped length in
    ``outlen`` and, when ``out`` is not NULL, its bytes (NOT_PLAIN past ``cap``)."""
    cdef Py_ssize_t o = 0, k
    cdef int cp, d, j
    cdef unsigned char c, e
    cdef unsigned char enc[4]
    cdef int elen
    if p >= n or h[p] != 0x22:
        return NOT_PLAIN
    p += 1
    while True:
        if p >= n:
            return NOT_PLAIN
        c = h[p]
        if c == 0x22:
            break
        if c < 0x20:
            return NOT_PLAIN
        if c >= 0x80:
            k = _utf8_seq(h, p, n)
            if k < 0:
                return NOT_PLAIN
            if out != NULL:
                if o + k > cap:
                    return NOT_PLAIN
                memcpy(out + o, h + p, <size_t>k)
            o += k
            p += k
            continue
        if c != 0x5C:
            if out != NULL:
                if o + 1 > cap:
                    return NOT_PLAIN
                out[o] = c
            o += 1
            p += 1
            continue
        if p + 1 >= n:
            return NOT_PLAIN
        e = h[p + 1]
        if e == 0x75:
            if p + 6 > n:
                return NOT_PLAIN
            cp = 0
            for j in range(4):
                d = _hex(h[p + 2 + j])
                if d < 0:
                    return NOT_PLAIN
                cp = cp * 16 + d
            if 0xD800 <= cp <= 0xDFFF:
                return NOT_PLAIN
            if cp < 0x80:
                enc[0] = <unsigned char>cp
                elen = 1
            elif cp < 0x800:
                enc[0] = <unsigned char>(0xC0 | (cp >> 6))
                enc[1] = <unsigned char>(0x80 | (cp & 0x3F))
                elen = 2
            else:
                enc[0] = <unsigned char>(0xE0 | (cp >> 12))
                enc[1] = <unsigned char>(0x80 | ((cp >> 6) & 0x3F))
                enc[2] = <unsigned char>(0x80 | (cp & 0x3F))
                elen = 3
            p += 6
        else:
            if e == 0x22 or e == 0x5C or e == 0x2F:
                enc[0] = e
            elif e == 0x62:
                enc[0] = 0x08
            elif e == 0x66:
                enc[0] = 0x0C
            elif e == 0x6E:
                enc[0] = 0x0A
            elif e == 0x72:
                enc[0] = 0x0D
            elif e == 0x74:
                enc[0] = 0x09
            else:
                return NOT_PLAIN
            elen = 1
            p += 2
        if out != NULL:
            if o + elen > cap:
                return NOT_PLAIN
            memcpy(out + o, enc, <size_t>elen)
        o += elen
    outlen[0] = o
    return p + 1


cdef Py_ssize_t _jint(const unsigned char* h, Py_ssize_t n, Py_ssize_t p,
                      int64_t* value) noexcept nogil:
    """Past the JSON integer at ``p`` (as the pure twin's ``_json_int``), or NOT_PLAIN."""
    cdef Py_ssize_t start = p, d
    cdef int64_t v = 0
    cdef bint neg = False
    if p < n and h[p] == 0x2D:
        neg = True
        p += 1
    d = p
    while p < n and 0x30 <= h[p] <= 0x39:
        v = v * 10 + (h[p] - 0x30)
        p += 1
    if p == d or p - d > MAX_DIGITS or (h[d] == 0x30 and (p - d > 1 or d > start)):
        return NOT_PLAIN
    if p < n and (h[p] == 0x2E or h[p] == 0x65 or h[p] == 0x45):
        return NOT_PLAIN
    value[0] = -v if neg else v
    return p


cdef inline Py_ssize_t _skip(const unsigned char* h, Py_ssize_t n, Py_ssize_t p) noexcept nogil:
    while p < n and _ws(h[p]):
        p += 1
    return p


cdef int _field_of(tuple names, const unsigned char* k, Py_ssize_t klen):
    cdef Py_ssize_t i
    cdef bytes name
    for i in range(len(names)):
        name = <bytes>names[i]
        if len(name) == klen and (klen == 0 or
                                  memcmp_(PyBytes_AS_STRING(name), <const char*>k, klen)):
            return <int>i
    return -1


cdef inline bint memcmp_(const char* a, const char* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


cdef inline bint _ascii(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 0x80:
            return False
    return True


cdef struct Parsed:
    int64_t code
    int64_t opaque
    int64_t flag
    int st
    Py_ssize_t hlen
    # Where each known field's value is: in the header (JSON: at its quote or its first
    # digit, with is_int; binary: its bytes), -1 when absent.
    Py_ssize_t fpos[NFIELDS]
    Py_ssize_t flen[NFIELDS]
    bint fint[NFIELDS]
    int64_t version
    # Every extFields entry, for the signed content: its key's bytes (ASCII, no escape)
    # and its value as fpos/flen/fint hold one; ``usual`` False when a key is not such,
    # or past MAXEXT entries.
    int next
    bint usual
    Py_ssize_t ekpos[MAXEXT]
    Py_ssize_t eklen[MAXEXT]
    Py_ssize_t evpos[MAXEXT]
    Py_ssize_t evlen[MAXEXT]
    bint evint[MAXEXT]


cdef inline void _entry(Parsed* r, Py_ssize_t kpos, Py_ssize_t klen, Py_ssize_t vpos,
                        Py_ssize_t vlen, bint is_int) noexcept nogil:
    """One more extFields entry for the signed content (past MAXEXT: none is usual)."""
    cdef int i = r.next
    if i >= MAXEXT:
        r.usual = False
        return
    r.ekpos[i] = kpos
    r.eklen[i] = klen
    r.evpos[i] = vpos
    r.evlen[i] = vlen
    r.evint[i] = is_int
    r.next = i + 1


cdef int _json_header(const unsigned char* h, Py_ssize_t n, Parsed* r) except -2:
    """0 and the fields in ``r``, or NOT_PLAIN."""
    cdef Py_ssize_t p, kend, klen, vstart
    cdef unsigned char key[SMALL]
    cdef int k = -1, f = -1, seen = 0
    cdef int64_t v
    cdef bint more, in_ext = False
    cdef tuple names = None
    cdef Py_ssize_t kstart = 0, kbytes = 0
    r.code = r.opaque = r.flag = r.version = 0
    p = _skip(h, n, 0)
    if p >= n or h[p] != 0x7B:
        return NOT_PLAIN
    p = _skip(h, n, p + 1)
    while True:
        # A key (the top level's, or extFields')
        kend = _jstr(h, n, p, NULL, 0, &klen)
        if kend < 0:
            return NOT_PLAIN
        if in_ext:
            kstart = p + 1
            kbytes = kend - p - 2
            if r.usual and (kbytes != klen or not _ascii(h + kstart, kbytes)):
                r.usual = False  # an escape or a byte past ASCII in the key
            f = -1
            if klen <= SMALL:
                _jstr(h, n, p, key, SMALL, &klen)
                f = _field_of(names, key, klen)
        else:
            if klen > SMALL:
                return NOT_PLAIN
            _jstr(h, n, p, key, SMALL, &klen)
            k = _field_of(_TOP, key, klen)
            if k < 0 or seen & (1 << k):
                return NOT_PLAIN
            seen |= 1 << k
        p = _skip(h, n, kend)
        if p >= n or h[p] != 0x3A:
            return NOT_PLAIN
        p = _skip(h, n, p + 1)
        if in_ext:
            vstart = p
            if p < n and h[p] == 0x22:
                p = _jstr(h, n, p, NULL, 0, &klen)
                if p < 0:
                    return NOT_PLAIN
                _entry(r, kstart, kbytes, vstart, p - vstart, False)
                if f >= 0:
                    if r.fpos[f] >= 0:
                        return NOT_PLAIN
                    r.fpos[f] = vstart
                    r.flen[f] = p - vstart
                    r.fint[f] = False
            else:
                p = _jint(h, n, p, &v)
                if p < 0:
                    return NOT_PLAIN
                _entry(r, kstart, kbytes, vstart, p - vstart, True)
                if f >= 0:
                    if r.fpos[f] >= 0:
                        return NOT_PLAIN
                    r.fpos[f] = vstart
                    r.flen[f] = p - vstart
                    r.fint[f] = True
        elif k == 0 or k == 2 or k == 3 or k == 4:
            p = _jint(h, n, p, &v)
            if p < 0:
                return NOT_PLAIN
            if k == 0:
                r.code = v
                if v == SEND_MESSAGE:
                    names = _V1
                elif v == SEND_MESSAGE_V2 or v == SEND_BATCH_MESSAGE:
                    names = _V2
            elif k == 2:
                r.version = v
            elif k == 3:
                r.opaque = v
            elif k == 4:
                r.flag = v
        elif k == 5:
            if p + 2 <= n and h[p] == 0x22 and h[p + 1] == 0x22:
                p += 2  # "": the C++ client's (a request's remark is never read)
            elif p + 4 > n or not memcmp_(<const char*>h + p, b"null", 4):
                return NOT_PLAIN
            else:
                p += 4
        elif k == 6:
            if names is None:
                return NOT_PLAIN  # extFields before the code (or not a send): not plain
            if p >= n or h[p] != 0x7B:
                return NOT_PLAIN
            p = _skip(h, n, p + 1)
            in_ext = True
            continue
        else:
            p = _jstr(h, n, p, NULL, 0, &klen)
            if p < 0:
                return NOT_PLAIN
        # After a value: ',' to the next key, '}' to close (extFields, then the top level)
        while True:
            p = _skip(h, n, p)
            if p >= n:
                return NOT_PLAIN
            if h[p] == 0x2C:
                p = _skip(h, n, p + 1)
                more = True
                break
            if h[p] != 0x7D:
                return NOT_PLAIN
            p += 1
            if in_ext:
                in_ext = False
                continue
            more = False
            break
        if not more:
            break
    if _skip(h, n, p) != n or not seen & 1:
        return NOT_PLAIN
    return 0


cdef int _binary_header(const unsigned char* h, Py_ssize_t n, Parsed* r) except -2:
    """0 and the fields in ``r``, or NOT_PLAIN (as the pure twin's ``_binary_header``)."""
    cdef Py_ssize_t pos, end, klen, vlen, kpos, vpos
    cdef int32_t ext_len
    cdef int f
    cdef tuple names
    if n < 13 + 8:
        return NOT_PLAIN
    r.code = <int16_t>((h[0] << 8) | h[1])
    r.version = <int16_t>((h[3] << 8) | h[4])
    r.opaque = <int32_t>_be32(h + 5)
    r.flag = <int32_t>_be32(h + 9)
    if _be32(h + 13) != 0:
        return NOT_PLAIN
    ext_len = <int32_t>_be32(h + 17)
    pos = 21
    if ext_len < 0 or ext_len > n - pos:
        return NOT_PLAIN
    if r.code == SEND_MESSAGE:
        names = _V1
    elif r.code == SEND_MESSAGE_V2 or r.code == SEND_BATCH_MESSAGE:
        names = _V2
    else:
        return NOT_PLAIN
    end = pos + ext_len
    while pos < end:
        if pos + 2 > n:
            return NOT_PLAIN
        klen = <int16_t>((h[pos] << 8) | h[pos + 1])
        pos += 2
        if klen < 0 or pos + klen > n or not _utf8_ok(h + pos, klen):
            return NOT_PLAIN
        kpos = pos
        pos += klen
        if pos + 4 > n:
            return NOT_PLAIN
        vlen = <int32_t>_be32(h + pos)
        pos += 4
        if vlen < 0 or pos + vlen > n or not _utf8_ok(h + pos, vlen):
            return NOT_PLAIN
        vpos = pos
        pos += vlen
        if pos > end:
            return NOT_PLAIN
        if klen == 0 or vlen == 0:
            continue
        if r.usual and not _ascii(h + kpos, klen):
            r.usual = False
        _entry(r, kpos, klen, vpos, vlen, True)
        f = _field_of(names, h + kpos, klen)
        if f >= 0:
            if r.fpos[f] >= 0:
                return NOT_PLAIN
            r.fpos[f] = vpos
            r.flen[f] = vlen
            r.fint[f] = True  # taken as they are (no JSON string to unescape)
    return 0


cdef Py_ssize_t _value(const unsigned char* h, Parsed* r, int f, unsigned char* out,
                       Py_ssize_t cap, bint json) except -2:
    """A field's bytes into ``out`` (their length), or NOT_PLAIN when longer than ``cap``;
    0 for an absent field."""
    cdef Py_ssize_t n = 0
    if r.fpos[f] < 0:
        return 0
    if json and not r.fint[f]:
        if _jstr(h, r.fpos[f] + r.flen[f], r.fpos[f], out, cap, &n) < 0:
            return NOT_PLAIN
        return n
    if r.flen[f] > cap:
        return NOT_PLAIN
    memcpy(out, h + r.fpos[f], <size_t>r.flen[f])
    return r.flen[f]


cdef int _int_of(const unsigned char* h, Parsed* r, int f, int64_t dflt, bint json,
                 int64_t* value) except -2:
    """An integer field (as the pure twin's ``_int_of``): 0, or NOT_PLAIN."""
    cdef unsigned char buf[SMALL]
    cdef Py_ssize_t n = _value(h, r, f, buf, SMALL, json), i = 0
    cdef int64_t v = 0
    if n < 0:
        return NOT_PLAIN
    if n == 0:
        value[0] = dflt
        return 0
    if buf[0] == 0x2D:
        i = 1
    if n - i < 1 or n - i > MAX_DIGITS:
        return NOT_PLAIN
    while i < n:
        if not 0x30 <= buf[i] <= 0x39:
            return NOT_PLAIN
        v = v * 10 + (buf[i] - 0x30)
        i += 1
    value[0] = -v if buf[0] == 0x2D else v
    return 0


cdef bytes _bytes_of(const unsigned char* h, Parsed* r, int f, bint json):
    """A string field's bytes (None: not plain); b"" when absent."""
    cdef Py_ssize_t n = 0
    cdef bytes out
    if r.fpos[f] < 0:
        return b""
    if json and not r.fint[f]:
        _jstr(h, r.fpos[f] + r.flen[f], r.fpos[f], NULL, 0, &n)
        out = PyBytes_FromStringAndSize(NULL, n)
        _jstr(h, r.fpos[f] + r.flen[f], r.fpos[f], <unsigned char*>PyBytes_AS_STRING(out), n, &n)
        return out
    return PyBytes_FromStringAndSize(<const char*>h + r.fpos[f], r.flen[f])


cdef tuple _UNSIGNED = (None, None, None)


cdef int _key_cmp(const unsigned char* h, Parsed* r, int a, int b) noexcept nogil:
    """Order of entries ``a`` and ``b`` by key (ASCII: bytes, shorter first on a tie)."""
    cdef Py_ssize_t la = r.eklen[a], lb = r.eklen[b], i
    cdef const unsigned char* ka = h + r.ekpos[a]
    cdef const unsigned char* kb = h + r.ekpos[b]
    for i in range(la if la < lb else lb):
        if ka[i] != kb[i]:
            return -1 if ka[i] < kb[i] else 1
    return -1 if la < lb else (1 if la > lb else 0)


cdef inline bint _key_is(const unsigned char* h, Parsed* r, int i, const char* name,
                         Py_ssize_t n) noexcept nogil:
    return r.eklen[i] == n and memcmp_(<const char*>h + r.ekpos[i], name, n)


cdef Py_ssize_t _entry_value(const unsigned char* h, Parsed* r, int i, bint json,
                             unsigned char* out) noexcept nogil:
    """Entry ``i``'s value bytes (into ``out`` unless NULL): their length."""
    cdef Py_ssize_t n = 0
    if json and not r.evint[i]:
        _jstr(h, r.evpos[i] + r.evlen[i], r.evpos[i], out, r.evlen[i], &n)
        return n
    if out != NULL:
        memcpy(out, h + r.evpos[i], <size_t>r.evlen[i])
    return r.evlen[i]


cdef bytes _entry_bytes(const unsigned char* h, Parsed* r, int i, bint json):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _entry_value(h, r, i, json, NULL))
    _entry_value(h, r, i, json, <unsigned char*>PyBytes_AS_STRING(out))
    return out


cdef tuple _signing(const unsigned char* h, Parsed* r, bint json):
    """(access key, signature, signed fields) of a header whose keys are all usual
    (the pure twin's ``_signing``)."""
    cdef int order[MAXEXT]
    cdef int i, j, t, c, ak = -1, sig = -1
    cdef Py_ssize_t total, at
    cdef bytes content
    cdef unsigned char* out
    cdef bint skip_unique = r.version <= OLD_SIGNING
    # Insertion sort of the (at most MAXEXT) entries by key; a key given twice: unusual.
    for i in range(r.next):
        j = i
        while j > 0:
            c = _key_cmp(h, r, order[j - 1], i)
            if c == 0:
                return _UNSIGNED
            if c < 0:
                break
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    total = 0
    for t in range(r.next):
        i = order[t]
        if _key_is(h, r, i, b"AccessKey", 9):
            ak = i
        elif _key_is(h, r, i, b"Signature", 9):
            sig = i
            continue
        elif skip_unique and _key_is(h, r, i, b"_UNIQUE_KEY_QUERY", 17):
            continue
        total += _entry_value(h, r, i, json, NULL)
    if ak < 0 or sig < 0:
        return (None if ak < 0 else _entry_bytes(h, r, ak, json).decode("utf-8"),
                None if sig < 0 else _entry_bytes(h, r, sig, json), None)
    content = PyBytes_FromStringAndSize(NULL, total)
    out = <unsigned char*>PyBytes_AS_STRING(content)
    at = 0
    for t in range(r.next):
        i = order[t]
        if i == sig or (skip_unique and _key_is(h, r, i, b"_UNIQUE_KEY_QUERY", 17)):
            continue
        at += _entry_value(h, r, i, json, out + at)
    return (_entry_bytes(h, r, ak, json).decode("utf-8"), _entry_bytes(h, r, sig, json),
            content)


cdef object _parse(const unsigned char* raw, Py_ssize_t n, tuple refuse, bint signed):
    """The SendFrame of one frame (without its total length), or None."""
    cdef Parsed r
    cdef uint32_t ori
    cdef Py_ssize_t hlen, blen
    cdef int f, rc
    cdef int64_t qid, sys_flag, born, flag, reconsume, maxrt
    cdef unsigned char small[SMALL]
    cdef const unsigned char* h
    cdef bint json
    cdef bytes props, topic, bad, body
    cdef tuple signing = _UNSIGNED
    if n < 4:
        return None
    ori = _be32(raw)
    hlen = ori & 0xFFFFFF
    if hlen > n - 4:
        return None
    for f in range(NFIELDS):
        r.fpos[f] = -1
        r.flen[f] = 0
        r.fint[f] = False
    r.next = 0
    r.usual = True
    h = raw + 4
    json = (ori >> 24) == 0
    if json:
        rc = _json_header(h, hlen, &r)
    elif (ori >> 24) == 1:
        rc = _binary_header(h, hlen, &r)
    else:
        return None
    if rc < 0 or r.flag & 0x3 or not -2147483648 <= r.opaque <= 2147483647:
        return None
    if r.code != SEND_MESSAGE and r.code != SEND_MESSAGE_V2 and r.code != SEND_BATCH_MESSAGE:
        return None
    if r.fpos[F_TOPIC] < 0:
        return None
    blen = _value(h, &r, F_BATCH, small, SMALL, json)
    if blen < 0 or not (blen == 0 or (blen == 5 and memcmp_(<const char*>small, b"false", 5))
                        or (blen == 1 and small[0] == 0x30)
                        or (r.code == SEND_BATCH_MESSAGE and (
                            (blen == 4 and memcmp_(<const char*>small, b"true", 4))
                            or (blen == 1 and small[0] == 0x31)))):
        return None
    if (_int_of(h, &r, F_MAXRT, 0, json, &maxrt) < 0
            or _int_of(h, &r, F_SYSFLAG, 0, json, &sys_flag) < 0
            or sys_flag & TRANSACTION_BITS
            or (r.code == SEND_BATCH_MESSAGE and sys_flag & COMPRESSED)
            or _int_of(h, &r, F_QUEUE, -1, json, &qid) < 0
            or _int_of(h, &r, F_BORN, 0, json, &born) < 0
            or _int_of(h, &r, F_FLAG, 0, json, &flag) < 0
            or _int_of(h, &r, F_RECONSUME, 0, json, &reconsume) < 0):
        return None
    topic = _bytes_of(h, &r, F_TOPIC, json)
    if not topic:
        return None
    props = _bytes_of(h, &r, F_PROPS, json)
    for bad in refuse:
        if bad in props:
            return None
    body = PyBytes_FromStringAndSize(<const char*>h + hlen, n - 4 - hlen)
    if signed and r.usual:
        signing = _signing(h, &r, json)
    return (<int>r.code, r.opaque, <int>(ori >> 24), topic.decode("utf-8"), qid, sys_flag,
            born, flag, props, reconsume, body,
            PyBytes_FromStringAndSize(<const char*>raw, 4 + hlen),
            signing[0], signing[1], signing[2])


def parse_send(frame, tuple refuse, bint signed=False):
    """The plain send in one frame (without its total length), or None."""
    cdef Py_buffer view
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        return _parse(<const unsigned char*>view.buf, view.len, refuse, signed)
    finally:
        PyBuffer_Release(&view)


def scan(buf, Py_ssize_t max_frame_bytes, decode_other, tuple refuse, bint signed=False):
    """The whole frames at the start of ``buf``: (items in order, bytes they took)."""
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef Py_ssize_t n, pos = 0
    cdef int32_t total
    cdef list items = []
    cdef object item, frame
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>view.buf
        n = view.len
        while n - pos >= 4:
            total = <int32_t>_be32(b + pos)
            if total < 4 or total > max_frame_bytes:
                raise ProtocolError(f"frame length {total} outside [4, {max_frame_bytes}]")
            if n - pos - 4 < total:
                break
            item = _parse(b + pos + 4, total, refuse, signed)
            if item is None:
                with memoryview(buf) as whole:
                    frame = whole[pos + 4:pos + 4 + total]
                    try:
                        item = decode_other(frame)
                    finally:
                        frame.release()
            items.append(item)
            pos += 4 + total
    finally:
        PyBuffer_Release(&view)
    return items, pos


cdef bytes _be(int64_t v, int width):
    cdef unsigned char out[4]
    cdef int i
    for i in range(width):
        out[i] = <unsigned char>((v >> (8 * (width - 1 - i))) & 0xFF)
    return PyBytes_FromStringAndSize(<const char*>out, width)


def encode_send_ok(int serialize_type, int64_t opaque, int version, str msg_id,
                   int64_t queue_id, int64_t queue_offset, str status, int64_t commit_offset):
    """The SUCCESS answer frame of a send (see the pure twin's docstring)."""
    cdef bytes header, mid = msg_id.encode("ascii"), st = status.encode("ascii")
    cdef bytes qid = b"%d" % queue_id, qoff = b"%d" % queue_offset, coff = b"%d" % commit_offset
    cdef bytes ext
    if serialize_type == 1:
        ext = b"".join([b"\x00\x05msgId", _be(len(mid), 4), mid,
                        b"\x00\x07queueId", _be(len(qid), 4), qid,
                        b"\x00\x0bqueueOffset", _be(len(qoff), 4), qoff,
                        b"\x00\x09putStatus", _be(len(st), 4), st,
                        b"\x00\x0fcommitLogOffset", _be(len(coff), 4), coff])
        header = b"".join([b"\x00\x00", _be(LANGUAGE_CODE, 1), _be(version, 2), _be(opaque, 4),
                           b"\x00\x00\x00\x01\x00\x00\x00\x00", _be(len(ext), 4), ext])
    elif serialize_type == 0:
        header = b'{"code":0,"language":"PYTHON","version":%d,"opaque":%d,"flag":1,' \
                 b'"extFields":{"msgId":"%s","queueId":"%s","queueOffset":"%s",' \
                 b'"putStatus":"%s","commitLogOffset":"%s"}}' % (version, opaque, mid, qid,
                                                                  qoff, st, coff)
    else:
        raise ProtocolError(f"serialize type {serialize_type} not supported (JSON=0, ROCKETMQ=1)")
    return b"".join([_be(len(header) + 4, 4), _be((serialize_type << 24) | len(header), 4),
                     header])


cdef inline char* _put_be(char* p, int64_t v, int width) noexcept:
    cdef int i
    for i in range(width):
        p[i] = <char>((v >> (8 * (width - 1 - i))) & 0xFF)
    return p + width


cdef inline char* _put_field(char* p, const char* name, int nlen, const char* v,
                             int vlen) noexcept:
    p = _put_be(p, nlen, 2)
    memcpy(p, name, nlen)
    p = _put_be(p + nlen, vlen, 4)
    memcpy(p, v, vlen)
    return p + vlen


cdef Py_ssize_t _send_ok(char* out, int serialize_type, int64_t opaque, int version,
                         const char* prefix, Py_ssize_t prefix_len, int64_t queue_id,
                         int64_t queue_offset, const char* st, Py_ssize_t st_len,
                         int64_t commit_offset) noexcept:
    # One SUCCESS frame at ``out`` (room for 320 + prefix + status bytes); its length.
    cdef char mid[96]
    cdef char qid[24]
    cdef char qoff[24]
    cdef char coff[24]
    cdef int mlen, qlen, olen, clen, hlen
    cdef char* p
    cdef char* ext
    memcpy(mid, prefix, prefix_len)
    mlen = <int>prefix_len + snprintf(mid + prefix_len, 24, "%016llX",
                                      <unsigned long long>commit_offset)
    qlen = snprintf(qid, 24, "%lld", <long long>queue_id)
    olen = snprintf(qoff, 24, "%lld", <long long>queue_offset)
    clen = snprintf(coff, 24, "%lld", <long long>commit_offset)
    p = out + 8
    if serialize_type == 1:
        memcpy(p, b"\x00\x00", 2)
        p = _put_be(p + 2, LANGUAGE_CODE, 1)
        p = _put_be(p, version, 2)
        p = _put_be(p, opaque, 4)
        p = _put_be(p, 1, 4)
        p = _put_be(p, 0, 4)
        ext = p + 4
        p = _put_field(ext, "msgId", 5, mid, mlen)
        p = _put_field(p, "queueId", 7, qid, qlen)
        p = _put_field(p, "queueOffset", 11, qoff, olen)
        p = _put_field(p, "putStatus", 9, st, <int>st_len)
        p = _put_field(p, "commitLogOffset", 15, coff, clen)
        _put_be(ext - 4, p - ext, 4)
        hlen = <int>(p - (out + 8))
    else:
        hlen = snprintf(p, 320 + prefix_len + st_len,
                        '{"code":0,"language":"PYTHON","version":%d,"opaque":%lld,"flag":1,'
                        '"extFields":{"msgId":"%.*s","queueId":"%.*s","queueOffset":"%.*s",'
                        '"putStatus":"%.*s","commitLogOffset":"%.*s"}}',
                        version, <long long>opaque, mlen, mid, qlen, qid, olen, qoff,
                        <int>st_len, st, clen, coff)
    _put_be(out, hlen + 4, 4)
    _put_be(out + 4, (serialize_type << 24) | hlen, 4)
    return 8 + hlen


def encode_send_oks(list sends, Py_ssize_t start, Py_ssize_t stop, int version,
                    str msg_id_prefix, object queue_ids, object queue_offsets,
                    object offsets, str status):
    """The SUCCESS answers of ``sends[start:stop]`` as one bytes (see the pure twin)."""
    cdef bytes prefix = msg_id_prefix.encode("ascii"), st = status.encode("ascii")
    cdef Py_ssize_t plen = len(prefix), slen = len(st), room, i, used = 0
    cdef int[:] qids
    cdef long long[:] qoffs, offs
    cdef char* buf
    cdef tuple send
    cdef int serialize_type
    if plen > 64 or slen > 64:
        raise ProtocolError("a message id prefix or put status of over 64 bytes")
    if start < 0 or start > stop or stop > len(sends):
        raise ProtocolError(f"answers {start}..{stop} outside {len(sends)} sends")
    qids = queue_ids
    qoffs = queue_offsets
    offs = offsets
    if qids.shape[0] < stop or qoffs.shape[0] < stop or offs.shape[0] < stop:
        raise ProtocolError(f"queue ids, queue offsets and offsets must hold {stop} values")
    room = 320 + plen + slen
    buf = <char*>malloc(<size_t>(room * (stop - start) + 1))
    if buf == NULL:
        raise MemoryError()
    try:
        for i in range(start, stop):
            send = <tuple>sends[i]
            serialize_type = send[2]
            if serialize_type != 0 and serialize_type != 1:
                raise ProtocolError(
                    f"serialize type {serialize_type} not supported (JSON=0, ROCKETMQ=1)")
            used += _send_ok(buf + used, serialize_type, send[1], version,
                             <const char*>prefix, plen, qids[i], qoffs[i],
                             <const char*>st, slen, offs[i])
        return PyBytes_FromStringAndSize(buf, used)
    finally:
        free(buf)
