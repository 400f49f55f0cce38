# cython: language_level=3
"""Compiled twin of the client's send request encode and send answer decode.

Same API, bytes and results as ``rmqha._core.send_codec_py``, whose docstring holds the
layouts.  The request frame is sized first and written once into a new bytes object; the
answer header is read by a scanner of the JSON the brokers write (a flat object, extFields
of strings), which hands anything else (escapes, non-ASCII, nested values, numbers that are
not small integers) to the pure twin, so both read every frame alike.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from rmqha.errors import ProtocolError
from rmqha._core.send_codec_py import ANSWER_FIELDS, DEFAULT_TOPIC, ENTRY_FIXED, LANGUAGE, Answer
from rmqha._core.send_codec_py import decode_send_answer as _py_decode_send_answer
from rmqha._core.send_codec_py import month_bounds

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    # A tuple subclass's allocator (what tuple.__new__ calls for one): a new reference.
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems)

cdef const char* _HEX = b"0123456789ABCDEF"
cdef const char* _HEXL = b"0123456789abcdef"
#: The short escapes of \b \t \n (none for 11) \f \r, indexed from 8.
cdef const char* _SHORT = b"btn?fr"

# The fixed pieces of a send request's JSON header, in order (see send_codec_py.encode_send).
cdef bytes _P_CODE = b'{"code":'
cdef bytes _P_VERSION = b',"language":"PYTHON","version":'
cdef bytes _P_OPAQUE = b',"opaque":'
cdef bytes _P_A = b',"flag":0,"extFields":{"a":"'
cdef bytes _P_B = b'","b":"'
cdef bytes _P_F = b'","c":"TBW102","d":"4","f":"'
cdef bytes _P_G = b'","g":"'
cdef bytes _P_H = b'","h":"'
cdef bytes _P_I = b'","i":"'
cdef bytes _P_M = b'","j":"0","k":"false","m":"'
cdef bytes _P_E = b'","e":"'
cdef bytes _P_END = b'"}}'

assert LANGUAGE == "PYTHON" and DEFAULT_TOPIC == "TBW102"  # the pieces above spell them


# --- UNIQ_KEY ---------------------------------------------------------------------------------


cdef inline long long _now_ms():
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef inline void _hex(char* out, unsigned long long value, int digits):
    cdef int i
    for i in range(digits - 1, -1, -1):
        out[i] = _HEX[value & 0xF]
        value >>= 4


cdef class UniqKeys:
    """One process's UNIQ_KEY maker (see send_codec_py).  The counter moves under the GIL,
    so threads never share a value."""

    cdef readonly str prefix
    cdef unsigned long long _counter
    cdef long long _start
    cdef long long _end
    cdef char _head[28]

    def __init__(self, str prefix not None):
        if len(prefix) != 20 or prefix.strip("0123456789ABCDEF"):
            raise ValueError(f"a UNIQ_KEY prefix is 20 upper-case hex digits, got {prefix!r}")
        self.prefix = prefix
        memcpy(self._head, PyUnicode_AsUTF8AndSize(prefix, NULL), 20)
        self._counter = 0
        self._start = 0
        self._end = 0

    cdef int _time_head(self) except -1:
        cdef long long now = _now_ms()
        if not self._start <= now < self._end:
            self._start, self._end = month_bounds(now)
        _hex(self._head + 20, <unsigned long long>(now - self._start) & 0xFFFFFFFF, 8)
        return 0

    def next(self):
        """A new id."""
        cdef char out[32]
        self._time_head()
        memcpy(out, self._head, 28)
        _hex(out + 28, self._counter & 0xFFFF, 4)
        self._counter += 1
        return PyUnicode_DecodeASCII(out, 32, NULL)

    def take(self, Py_ssize_t count):
        """``count`` new ids, reading the clock once (a batch's)."""
        cdef char out[32]
        cdef Py_ssize_t i
        cdef list ids = []
        self._time_head()
        memcpy(out, self._head, 28)
        for i in range(count):
            _hex(out + 28, self._counter & 0xFFFF, 4)
            self._counter += 1
            ids.append(PyUnicode_DecodeASCII(out, 32, NULL))
        return ids


# --- the request ----------------------------------------------------------------------------


cdef inline Py_ssize_t _escaped_size(const unsigned char* s, Py_ssize_t n) noexcept:
    """Bytes of ``s`` as a JSON string's inside, escaped as orjson escapes."""
    cdef Py_ssize_t size = n, i
    cdef unsigned char ch
    for i in range(n):
        ch = s[i]
        if ch == 34 or ch == 92:
            size += 1
        elif ch < 0x20:
            size += 1 if (ch == 8 or ch == 9 or ch == 10 or ch == 12 or ch == 13) else 5
    return size


cdef inline char* _put_escaped(char* out, const unsigned char* s, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    cdef unsigned char ch
    for i in range(n):
        ch = s[i]
        if ch >= 0x20 and ch != 34 and ch != 92:
            out[0] = <char>ch
            out += 1
        elif ch == 34 or ch == 92:
            out[0] = 92
            out[1] = <char>ch
            out += 2
        elif ch == 8 or ch == 9 or ch == 10 or ch == 12 or ch == 13:
            out[0] = 92
            out[1] = _SHORT[ch - 8]
            out += 2
        else:
            memcpy(out, b"\\u00", 4)
            out[4] = _HEXL[ch >> 4]
            out[5] = _HEXL[ch & 0xF]
            out += 6
    return out


cdef inline int _digits(long long value, char* buf) noexcept:
    """``value`` in decimal into ``buf`` (at least 20 bytes); returns its length."""
    cdef unsigned long long u = <unsigned long long>value
    cdef char tmp[20]
    cdef int n = 0, i = 0
    if value < 0:
        u = (~u) + 1
    while True:
        tmp[n] = <char>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    if value < 0:
        buf[0] = 45
        i = 1
    while n:
        n -= 1
        buf[i] = tmp[n]
        i += 1
    return i


cdef inline char* _put(char* out, bytes piece) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(piece)
    memcpy(out, PyBytes_AS_STRING(piece), n)
    return out + n


cdef inline const unsigned char* _utf8(str text, Py_ssize_t* n, str topic) except NULL:
    try:
        return <const unsigned char*>PyUnicode_AsUTF8AndSize(text, n)
    except UnicodeEncodeError as exc:
        raise ProtocolError(f"cannot encode the header of a send to {topic!r}: {exc}") from exc


@cython.boundscheck(False)
@cython.wraparound(False)
def encode_send(long long code, long long opaque, long long version, str group not None,
                str topic not None, long long sys_flag, long long born_ms, long long flag,
                str properties not None, bint batch, long long queue_id, bytes body not None):
    """The whole frame of one send request (see send_codec_py)."""
    cdef Py_ssize_t ng, nt, npr
    cdef const unsigned char* g = _utf8(group, &ng, topic)
    cdef const unsigned char* t = _utf8(topic, &nt, topic)
    cdef const unsigned char* pr = _utf8(properties, &npr, topic)
    cdef char d_code[24]
    cdef char d_version[24]
    cdef char d_opaque[24]
    cdef char d_sys[24]
    cdef char d_born[24]
    cdef char d_flag[24]
    cdef char d_qid[24]
    cdef int l_code = _digits(code, d_code), l_version = _digits(version, d_version)
    cdef int l_opaque = _digits(opaque, d_opaque), l_sys = _digits(sys_flag, d_sys)
    cdef int l_born = _digits(born_ms, d_born), l_flag = _digits(flag, d_flag)
    cdef int l_qid = _digits(queue_id, d_qid)
    cdef Py_ssize_t fixed = (len(_P_CODE) + len(_P_VERSION) + len(_P_OPAQUE) + len(_P_A)
                             + len(_P_B) + len(_P_F) + len(_P_G) + len(_P_H) + len(_P_I)
                             + len(_P_M) + len(_P_E) + len(_P_END))
    cdef Py_ssize_t header_length = (
        fixed + l_code + l_version + l_opaque + l_sys + l_born + l_flag + l_qid
        + (4 if batch else 5) + _escaped_size(g, ng) + _escaped_size(t, nt)
        + _escaped_size(pr, npr))
    cdef Py_ssize_t body_length = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t total = 4 + header_length + body_length
    if header_length > 0xFFFFFF or total > 0x7FFFFFFF:
        raise ProtocolError(f"a send of {total} bytes to {topic!r} does not fit one frame")
    cdef bytes frame = PyBytes_FromStringAndSize(NULL, 4 + total)
    cdef char* out = PyBytes_AS_STRING(frame)
    _be32(out, <unsigned int>total)
    _be32(out + 4, <unsigned int>header_length)
    out += 8
    out = _put(out, _P_CODE)
    memcpy(out, d_code, l_code); out += l_code
    out = _put(out, _P_VERSION)
    memcpy(out, d_version, l_version); out += l_version
    out = _put(out, _P_OPAQUE)
    memcpy(out, d_opaque, l_opaque); out += l_opaque
    out = _put(out, _P_A)
    out = _put_escaped(out, g, ng)
    out = _put(out, _P_B)
    out = _put_escaped(out, t, nt)
    out = _put(out, _P_F)
    memcpy(out, d_sys, l_sys); out += l_sys
    out = _put(out, _P_G)
    memcpy(out, d_born, l_born); out += l_born
    out = _put(out, _P_H)
    memcpy(out, d_flag, l_flag); out += l_flag
    out = _put(out, _P_I)
    out = _put_escaped(out, pr, npr)
    out = _put(out, _P_M)
    if batch:
        memcpy(out, b"true", 4); out += 4
    else:
        memcpy(out, b"false", 5); out += 5
    out = _put(out, _P_E)
    memcpy(out, d_qid, l_qid); out += l_qid
    out = _put(out, _P_END)
    memcpy(out, PyBytes_AS_STRING(body), body_length)
    return frame


cdef inline void _be32(char* out, unsigned int v) noexcept:
    out[0] = <char>(v >> 24)
    out[1] = <char>(v >> 16)
    out[2] = <char>(v >> 8)
    out[3] = <char>v


# --- the answer -----------------------------------------------------------------------------

# Why the scanner gives up (the pure twin then reads the frame): any of these returns
# _OTHER, and a frame read to its end returns _DONE.
cdef enum:
    _DONE = 0
    _OTHER = -1

cdef enum:
    FLAG_RESPONSE = 1  # rmqha.protocol.command.FLAG_RESPONSE

cdef enum:
    # Answer slots: the header's own, then ANSWER_FIELDS in order.
    S_REMARK = 0
    S_MSG_ID = 1
    S_QUEUE_ID = 2
    S_QUEUE_OFFSET = 3
    S_PUT_STATUS = 4
    S_MASTER = 5
    N_SLOTS = 6

assert ANSWER_FIELDS == ("msgId", "queueId", "queueOffset", "putStatus", "masterAddress")


cdef struct _Scan:
    const unsigned char* p
    const unsigned char* end
    long long code
    long long opaque
    long long flag
    bint has_code
    bint seen_ext
    const unsigned char* start[N_SLOTS]
    Py_ssize_t length[N_SLOTS]  # -1: absent or null


cdef inline void _ws(_Scan* s) noexcept:
    while s.p < s.end and (s.p[0] == 32 or s.p[0] == 9 or s.p[0] == 10 or s.p[0] == 13):
        s.p += 1


cdef inline int _string(_Scan* s, const unsigned char** start, Py_ssize_t* length) noexcept:
    """A string without escapes, of printable ASCII; _OTHER for anything else."""
    if s.p >= s.end or s.p[0] != 34:
        return _OTHER
    s.p += 1
    start[0] = s.p
    while s.p < s.end:
        if s.p[0] == 34:
            length[0] = s.p - start[0]
            s.p += 1
            return _DONE
        if s.p[0] == 92 or s.p[0] < 0x20 or s.p[0] >= 0x80:
            return _OTHER
        s.p += 1
    return _OTHER


cdef inline int _integer(_Scan* s, long long* out) noexcept:
    """An integer of at most 18 digits, JSON's spelling; _OTHER for anything else."""
    cdef bint negative = False
    cdef long long value = 0
    cdef int digits = 0
    if s.p < s.end and s.p[0] == 45:
        negative = True
        s.p += 1
    if s.p < s.end and s.p[0] == 48 and s.p + 1 < s.end and 48 <= s.p[1] <= 57:
        return _OTHER  # a leading zero: not JSON
    while s.p < s.end and 48 <= s.p[0] <= 57:
        value = value * 10 + (s.p[0] - 48)
        digits += 1
        s.p += 1
        if digits > 18:
            return _OTHER
    if digits == 0 or (s.p < s.end and (s.p[0] == 46 or s.p[0] == 101 or s.p[0] == 69)):
        return _OTHER
    out[0] = -value if negative else value
    return _DONE


cdef inline bint _word(_Scan* s, const char* word, Py_ssize_t n) noexcept:
    if s.end - s.p >= n and memcmp(s.p, word, n) == 0:
        s.p += n
        return True
    return False


cdef inline int _scalar(_Scan* s) noexcept:
    """Skip a string, an integer, true, false or null."""
    cdef const unsigned char* ignored
    cdef Py_ssize_t n
    cdef long long v
    if s.p >= s.end:
        return _OTHER
    if s.p[0] == 34:
        return _string(s, &ignored, &n)
    if _word(s, b"true", 4) or _word(s, b"false", 5) or _word(s, b"null", 4):
        return _DONE
    return _integer(s, &v)


cdef inline int _slot_of_ext(const unsigned char* k, Py_ssize_t n) noexcept:
    if n == 5 and memcmp(k, b"msgId", 5) == 0:
        return S_MSG_ID
    if n == 7 and memcmp(k, b"queueId", 7) == 0:
        return S_QUEUE_ID
    if n == 11 and memcmp(k, b"queueOffset", 11) == 0:
        return S_QUEUE_OFFSET
    if n == 9 and memcmp(k, b"putStatus", 9) == 0:
        return S_PUT_STATUS
    if n == 13 and memcmp(k, b"masterAddress", 13) == 0:
        return S_MASTER
    return -1


cdef int _ext(_Scan* s) noexcept:
    """extFields: null or an object of string (or null) values."""
    cdef const unsigned char* k
    cdef const unsigned char* v
    cdef Py_ssize_t nk, nv
    cdef int slot
    if s.seen_ext:
        return _OTHER  # a second extFields replaces the first: the pure twin knows how
    s.seen_ext = True
    if _word(s, b"null", 4):
        return _DONE
    if s.p >= s.end or s.p[0] != 123:
        return _OTHER
    s.p += 1
    _ws(s)
    if s.p < s.end and s.p[0] == 125:
        s.p += 1
        return _DONE
    while True:
        _ws(s)
        if _string(s, &k, &nk) != _DONE:
            return _OTHER
        _ws(s)
        if s.p >= s.end or s.p[0] != 58:
            return _OTHER
        s.p += 1
        _ws(s)
        slot = _slot_of_ext(k, nk)
        if _word(s, b"null", 4):
            if slot >= 0:
                s.length[slot] = -1
        elif _string(s, &v, &nv) == _DONE:
            if slot >= 0:
                s.start[slot] = v
                s.length[slot] = nv
        else:
            return _OTHER
        _ws(s)
        if s.p < s.end and s.p[0] == 44:
            s.p += 1
            continue
        if s.p < s.end and s.p[0] == 125:
            s.p += 1
            return _DONE
        return _OTHER


cdef int _member(_Scan* s, const unsigned char* k, Py_ssize_t n) noexcept:
    """The value of top-level key ``k``."""
    cdef const unsigned char* v
    cdef Py_ssize_t nv
    if n == 4 and memcmp(k, b"code", 4) == 0:
        s.has_code = True
        return _integer(s, &s.code)
    if n == 6 and memcmp(k, b"opaque", 6) == 0:
        return _integer(s, &s.opaque)
    if n == 4 and memcmp(k, b"flag", 4) == 0:
        return _integer(s, &s.flag)
    if n == 6 and memcmp(k, b"remark", 6) == 0:
        if _word(s, b"null", 4):
            s.length[S_REMARK] = -1
            return _DONE
        if _string(s, &v, &nv) != _DONE:
            return _OTHER
        s.start[S_REMARK] = v
        s.length[S_REMARK] = nv
        return _DONE
    if n == 9 and memcmp(k, b"extFields", 9) == 0:
        return _ext(s)
    return _scalar(s)


cdef int _header(_Scan* s) noexcept:
    """The whole JSON header: one object, then only white space."""
    cdef const unsigned char* k
    cdef Py_ssize_t nk
    _ws(s)
    if s.p >= s.end or s.p[0] != 123:
        return _OTHER
    s.p += 1
    _ws(s)
    if s.p < s.end and s.p[0] == 125:
        return _OTHER  # no code: the pure twin answers
    while True:
        _ws(s)
        if _string(s, &k, &nk) != _DONE:
            return _OTHER
        _ws(s)
        if s.p >= s.end or s.p[0] != 58:
            return _OTHER
        s.p += 1
        _ws(s)
        if _member(s, k, nk) != _DONE:
            return _OTHER
        _ws(s)
        if s.p < s.end and s.p[0] == 44:
            s.p += 1
            continue
        if s.p < s.end and s.p[0] == 125:
            s.p += 1
            break
        return _OTHER
    _ws(s)
    return _DONE if s.p == s.end and s.has_code else _OTHER


cdef inline object _text(_Scan* s, int slot):
    if s.length[slot] < 0:
        return None
    return PyUnicode_DecodeASCII(<const char*>s.start[slot], s.length[slot], NULL)


cdef int _read_answer(_Scan* s, const unsigned char* frame, Py_ssize_t header_length) noexcept:
    """Scan the JSON header of ``header_length`` bytes after the frame's header length
    field (the lengths checked by the caller): _DONE, or _OTHER for the pure twin."""
    cdef int i
    s.p = frame + 4
    s.end = frame + 4 + header_length
    s.code = 0
    s.opaque = 0
    s.flag = 0
    s.has_code = False
    s.seen_ext = False
    for i in range(N_SLOTS):
        s.length[i] = -1
    return _header(s)


#: send_codec_py's NamedTuple (a tuple subclass, no dict), held by the import above.
cdef PyTypeObject* _ANSWER = <PyTypeObject*>Answer


cdef inline void _slot(object answer, Py_ssize_t i, object value):
    Py_INCREF(value)  # PyTuple_SET_ITEM steals it
    PyTuple_SET_ITEM(answer, i, value)


cdef inline object _answer(_Scan* s):
    """An Answer, filled in place as tuple.__new__ fills one (the pure twin's way) without
    the intermediate tuple: as cheap as the plain tuple this used to return."""
    cdef object answer = PyType_GenericAlloc(_ANSWER, 9)
    _slot(answer, 0, s.code)
    _slot(answer, 1, s.opaque)
    _slot(answer, 2, s.flag)
    _slot(answer, 3, _text(s, S_REMARK))
    _slot(answer, 4, _text(s, S_MSG_ID))
    _slot(answer, 5, _text(s, S_QUEUE_ID))
    _slot(answer, 6, _text(s, S_QUEUE_OFFSET))
    _slot(answer, 7, _text(s, S_PUT_STATUS))
    _slot(answer, 8, _text(s, S_MASTER))
    return answer


cdef inline unsigned int _u32(const unsigned char* p) noexcept:
    return (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3]


def decode_send_answer(frame):
    """The fields of a send's answer frame (see send_codec_py)."""
    cdef Py_buffer view
    cdef _Scan s
    cdef const unsigned char* data
    cdef unsigned int ori
    cdef Py_ssize_t header_length
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        data = <const unsigned char*>view.buf
        if view.len < 4:
            raise ProtocolError(f"frame of {view.len} bytes is shorter than its header length")
        ori = _u32(data)
        header_length = ori & 0xFFFFFF
        if header_length > view.len - 4:
            raise ProtocolError(f"header length {header_length} exceeds the frame "
                                f"({view.len - 4} bytes left)")
        if ori >> 24:
            return None
        if _read_answer(&s, data, header_length) != _DONE:
            return _py_decode_send_answer(frame)
        return _answer(&s)
    finally:
        PyBuffer_Release(&view)


def match_answers(data, dict pending not None, dict deadlines not None,
                  Py_ssize_t max_frame_bytes, Py_ssize_t limit):
    """Hand the answers at the start of a read to the sends waiting for them (see
    send_codec_py): the scanner reads each header in place, the pure twin what it does
    not read."""
    cdef Py_buffer view
    cdef _Scan s
    cdef const unsigned char* p
    cdef const unsigned char* frame
    cdef Py_ssize_t pos = 0, count = 0, end, total, header_length
    cdef unsigned int ori
    cdef object answer, fut, opaque
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char*>view.buf
        end = view.len
        while count < limit and end - pos >= 8:
            total = <int>_u32(p + pos)  # a signed int32, as the general decoder reads it
            if total < 4 or total > max_frame_bytes or end - pos - 4 < total:
                break
            frame = p + pos + 4
            ori = _u32(frame)
            header_length = ori & 0xFFFFFF
            if ori >> 24 or header_length > total - 4:
                break  # binary (None) or broken (ProtocolError) to decode_send_answer
            if _read_answer(&s, frame, header_length) == _DONE:
                if not s.flag & FLAG_RESPONSE:
                    break
                opaque = s.opaque
                fut = pending.pop(opaque, None)
                if fut is None:
                    break
                answer = _answer(&s)
            else:
                try:
                    answer = _py_decode_send_answer(memoryview(data)[pos + 4:pos + 4 + total])
                except ProtocolError:
                    break
                if answer is None or not answer.flag & FLAG_RESPONSE:
                    break
                opaque = answer.opaque
                fut = pending.pop(opaque, None)
                if fut is None:
                    break
            deadlines.pop(opaque, None)
            if not fut.done():
                fut.set_result(answer)
            pos += 4 + total
            count += 1
    finally:
        PyBuffer_Release(&view)
    return pos, count


# --- plain batches ----------------------------------------------------------------------------

cdef enum:
    C_ENTRY_FIXED = 22

assert ENTRY_FIXED == C_ENTRY_FIXED


@cython.boundscheck(False)
@cython.wraparound(False)
def encode_plain_batch(bodies, uids, str head not None, str tail not None, Py_ssize_t start,
                       long long max_bytes):
    """One SEND_BATCH_MESSAGE body of plain messages and the index past it (see
    send_codec_py): sized in one pass, written in a second."""
    cdef Py_ssize_t count = len(bodies)
    if not 0 <= start < count or len(uids) != count:
        raise ValueError(f"start {start} outside {count} bodies with {len(uids)} ids")
    cdef Py_ssize_t nh, nt, nu, nb, nprops, i
    cdef const char* h = PyUnicode_AsUTF8AndSize(head, &nh)
    cdef const char* t = PyUnicode_AsUTF8AndSize(tail, &nt)
    cdef long long fixed_chars = len(head) + len(tail)
    cdef long long size = 0, item
    cdef Py_ssize_t end = start, total = 0
    cdef object body, uid
    while end < count:
        body = bodies[end]
        uid = uids[end]
        if type(body) is not bytes:
            raise TypeError(f"batch body {end} is {type(body).__name__}, not bytes")
        if type(uid) is not str:
            raise TypeError(f"UNIQ_KEY {end} is {type(uid).__name__}, not str")
        nb = PyBytes_GET_SIZE(body)
        item = C_ENTRY_FIXED + nb + 4 * (fixed_chars + len(<str>uid))
        if end > start and size + item > max_bytes:
            break
        PyUnicode_AsUTF8AndSize(uid, &nu)
        nprops = nh + nu + nt
        if nprops > 32767:
            raise ProtocolError(f"properties of {nprops} bytes exceed 32767")
        total += C_ENTRY_FIXED + nb + nprops
        size += item
        end += 1
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef const char* u
    for i in range(start, end):
        body = bodies[i]
        nb = PyBytes_GET_SIZE(body)
        u = PyUnicode_AsUTF8AndSize(uids[i], &nu)
        nprops = nh + nu + nt
        _be32(p, <unsigned int>(C_ENTRY_FIXED + nb + nprops))
        _be32(p + 4, 0)
        _be32(p + 8, 0)
        _be32(p + 12, 0)
        _be32(p + 16, <unsigned int>nb)
        p += 20
        memcpy(p, PyBytes_AS_STRING(body), nb)
        p += nb
        p[0] = <char>(nprops >> 8)
        p[1] = <char>nprops
        p += 2
        memcpy(p, h, nh)
        memcpy(p + nh, u, nu)
        memcpy(p + nh + nu, t, nt)
        p += nprops
    return out, end
