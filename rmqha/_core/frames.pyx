# cython: language_level=3
"""Compiled twin of the HA wire frames (a hot path; ARCHITECTURE.md lists them).

Same API, bytes and results as ``rmqha._core.frames_py``, whose docstring holds both
dialects' layouts; the frame dataclasses and enums are imported from there so both twins
return equal objects, except TRANSFER_DATA: its own extension type here (decoded fields kept
in C until read, data sliced from the chunk on first read) behaves as, and compares equal
to, the dataclass.  Headers are read and written through raw pointers after explicit length
checks, and the batch helpers run whole batches of TRANSFER_DATA headers in C loops.
"""
cimport cython
from cpython.array cimport array, clone, resize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t
from libc.string cimport memcpy

from rmqha.errors import ProtocolError
from rmqha._core.frames_py import (
    CheckResult,
    ConfirmTruncate,
    ConnectionState,
    DEFAULT_MAX_FRAME_BYTES,
    Dialect,
    Direction,
    FrameType,
    HandshakeMaster,
    HandshakeSlave,
    HEADER_SIZE,
    MASTER_TO_SLAVE_TYPES,
    QueryEpoch,
    RETURN_EPOCH_ENTRY_SIZE,
    ReturnEpoch,
    RMQ_EPOCH_ENTRY_SIZE,
    RMQ_MASTER_HANDSHAKE_SIZE,
    RMQ_MASTER_TRANSFER_SIZE,
    RMQ_SLAVE_ACK_SIZE,
    RMQ_SLAVE_HANDSHAKE_SIZE,
    RmqMasterHandshake,
    RmqMasterTransfer,
    RmqSlaveAck,
    RmqSlaveHandshake,
    SLAVE_TO_MASTER_TYPES,
    TRANSFER_HEADER_SIZE,
    TransferAck,
)
from rmqha._core.frames_py import TransferData as _PyTransferData

cdef enum:
    C_HDR = 24
    C_TD = 48
    C_RMQ_HS_SLAVE = 16
    C_RMQ_ACK = 12
    C_RMQ_HS_MASTER = 20
    C_RMQ_TRANSFER = 36
    C_RMQ_ENTRY = 12
    C_RE_ENTRY = 20
    C_INT32_MAX = 2147483647

cdef array _Q_TEMPLATE = array("q")

# --- byte order helpers (big-endian, unaligned) ------------------------------------------------


cdef extern from *:
    """
    /* Big-endian loads and stores through memcpy (unaligned-safe) and a byte swap. */
    #include <string.h>
    #include <stdint.h>
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    #define RMQHA_BE32(x) (x)
    #define RMQHA_BE64(x) (x)
    #define RMQHA_BE16(x) (x)
    #else
    #define RMQHA_BE32(x) __builtin_bswap32(x)
    #define RMQHA_BE64(x) __builtin_bswap64(x)
    #define RMQHA_BE16(x) __builtin_bswap16(x)
    #endif
    static inline int32_t rmqha_rd32(const unsigned char *p) { uint32_t u; memcpy(&u, p, 4); return (int32_t) RMQHA_BE32(u); }
    static inline int16_t rmqha_rd16(const unsigned char *p) { uint16_t u; memcpy(&u, p, 2); return (int16_t) RMQHA_BE16(u); }
    static inline int64_t rmqha_rd64(const unsigned char *p) { uint64_t u; memcpy(&u, p, 8); return (int64_t) RMQHA_BE64(u); }
    static inline void rmqha_wr32(unsigned char *p, int32_t v) { uint32_t u = RMQHA_BE32((uint32_t) v); memcpy(p, &u, 4); }
    static inline void rmqha_wr16(unsigned char *p, int16_t v) { uint16_t u = RMQHA_BE16((uint16_t) v); memcpy(p, &u, 2); }
    static inline void rmqha_wr64(unsigned char *p, int64_t v) { uint64_t u = RMQHA_BE64((uint64_t) v); memcpy(p, &u, 8); }
    #if defined(__GNUC__)
    #define RMQHA_PREFETCH(p) __builtin_prefetch((const void *) (p))
    #else
    #define RMQHA_PREFETCH(p) ((void) (p))
    #endif
    """
    int32_t rd32 "rmqha_rd32" (const unsigned char *p) noexcept nogil
    int16_t rd16 "rmqha_rd16" (const unsigned char *p) noexcept nogil
    int64_t rd64 "rmqha_rd64" (const unsigned char *p) noexcept nogil
    void wr32 "rmqha_wr32" (unsigned char *p, int32_t v) noexcept nogil
    void wr16 "rmqha_wr16" (unsigned char *p, int16_t v) noexcept nogil
    void wr64 "rmqha_wr64" (unsigned char *p, int64_t v) noexcept nogil
    void prefetch "RMQHA_PREFETCH" (const unsigned char *p) noexcept nogil


cdef inline void wr_td(unsigned char *p, int64_t block, int64_t estart, int64_t confirm,
                       int64_t dlen, int64_t epoch, int64_t ts) noexcept nogil:
    wr32(p, <int32_t> (C_TD + dlen))
    wr32(p + 4, 6)
    wr64(p + 8, ts)
    wr64(p + 16, epoch)
    wr64(p + 24, block)
    wr64(p + 32, estart)
    wr64(p + 40, confirm)


# --- conversions and checks --------------------------------------------------------------------


cdef int64_t _i64(object v, str where) except? -1:
    try:
        return v
    except OverflowError:
        raise ProtocolError(f"{where}: field out of range: {v} does not fit an int64") from None


cdef int32_t _i32(object v, str where) except? -1:
    try:
        return v
    except OverflowError:
        raise ProtocolError(f"{where}: field out of range: {v} does not fit an int32") from None


cdef object _perr(str what, str where):
    return ProtocolError(f"{where}: {what}")


cdef int64_t _check_max(object max_frame_bytes) except -1:
    cdef int64_t m = max_frame_bytes
    if m < C_RMQ_TRANSFER or m > C_INT32_MAX:
        raise ValueError(f"max_frame_bytes {m} is outside {C_RMQ_TRANSFER}..{C_INT32_MAX}")
    return m


cdef object _data_of(object buf, object view, Py_ssize_t start, Py_ssize_t end, bint owned=False):
    """Zero-copy slice of an immutable (or decoder-owned) buffer, a bytes copy of a mutable one."""
    if owned or type(buf) is bytes:
        return view[start:end]
    return bytes(view[start:end])


# --- the compiled TransferData frame ------------------------------------------------------------
# TRANSFER_DATA is the one frame a stream carries by the thousand, so this twin has its own
# type for it: the decoder fills C fields and keeps the block as (per-chunk view, start, end);
# the Python ints and the memoryview slice are only made when an attribute is read.  To
# callers it is the dataclass ``frames_py.TransferData``: same constructor, attributes
# (settable), ``__match_args__``, equality (also with the dataclass), repr, unhashable.


@cython.final
@cython.freelist(64)
cdef class TransferData:
    """A block of the log; ``epoch`` (envelope) is the block's own epoch; empty data = heartbeat."""

    # A decoded frame keeps its five integers in C fields (_vals is None); a frame built or
    # changed by a caller keeps them, as given, in the list _vals (like the dataclass, the
    # constructor takes any value: encode is where they are checked).
    cdef int64_t _b, _s, _c, _ts, _ep
    cdef list _vals
    # When _lazy, the data is _data[_start:_end] (_data the per-chunk view), sliced on first read.
    cdef object _data
    cdef Py_ssize_t _start, _end
    cdef bint _lazy

    __match_args__ = _PyTransferData.__match_args__

    def __init__(self, block_start_offset, epoch_start_offset, confirm_offset, data=b"",
                 timestamp_ms=0, epoch=0):
        self._vals = [block_start_offset, epoch_start_offset, confirm_offset, timestamp_ms, epoch]
        self._data = data
        self._lazy = False

    cdef inline object _get(self, int i, int64_t native):
        return native if self._vals is None else self._vals[i]

    cdef inline void _set(self, int i, object value):
        if self._vals is None:
            self._vals = [self._b, self._s, self._c, self._ts, self._ep]
        self._vals[i] = value

    @property
    def block_start_offset(self):
        return self._get(0, self._b)

    @block_start_offset.setter
    def block_start_offset(self, value):
        self._set(0, value)

    @property
    def epoch_start_offset(self):
        return self._get(1, self._s)

    @epoch_start_offset.setter
    def epoch_start_offset(self, value):
        self._set(1, value)

    @property
    def confirm_offset(self):
        return self._get(2, self._c)

    @confirm_offset.setter
    def confirm_offset(self, value):
        self._set(2, value)

    @property
    def timestamp_ms(self):
        return self._get(3, self._ts)

    @timestamp_ms.setter
    def timestamp_ms(self, value):
        self._set(3, value)

    @property
    def epoch(self):
        return self._get(4, self._ep)

    @epoch.setter
    def epoch(self, value):
        self._set(4, value)

    @property
    def data(self):
        if self._lazy:
            # Sliced once, then kept: ``f.data is f.data`` as with the dataclass.
            self._data = self._data[self._start:self._end]
            self._lazy = False
        return self._data

    @data.setter
    def data(self, value):
        self._lazy = False
        self._data = value

    def __eq__(self, other):
        if type(other) is TransferData or type(other) is _PyTransferData:
            return _td_values(self) == _td_values(other)
        return NotImplemented

    def __ne__(self, other):
        if type(other) is TransferData or type(other) is _PyTransferData:
            return _td_values(self) != _td_values(other)
        return NotImplemented

    # Mutable with value equality, so unhashable (as the dataclass).
    __hash__ = None

    def __repr__(self):
        return (f"{type(self).__qualname__}(block_start_offset={self.block_start_offset!r}, "
                f"epoch_start_offset={self.epoch_start_offset!r}, confirm_offset={self.confirm_offset!r}, "
                f"data={self.data!r}, timestamp_ms={self.timestamp_ms!r}, epoch={self.epoch!r})")

    def __reduce__(self):
        return TransferData, _td_values(self)


cdef tuple _td_values(object f):
    return (f.block_start_offset, f.epoch_start_offset, f.confirm_offset, f.data, f.timestamp_ms, f.epoch)


cdef inline TransferData _td_decoded(int64_t b, int64_t s, int64_t c, int64_t ts, int64_t ep, bint lazy,
                                     object view, const unsigned char *base, Py_ssize_t start,
                                     Py_ssize_t end):
    """A decoded frame: with ``lazy`` (the buffer is immutable or decoder-owned) its data is a
    view of ``view`` made on first read, else a copy made now."""
    cdef TransferData f = TransferData.__new__(TransferData)
    f._b = b
    f._s = s
    f._c = c
    f._ts = ts
    f._ep = ep
    if lazy:
        f._data = view
        f._start = start
        f._end = end
        f._lazy = True
    else:
        # A mutable receive buffer may be reused by the caller: copy the block out now.
        f._data = PyBytes_FromStringAndSize(<const char *> base + start, end - start)
    return f


cdef int _direction(object direction) except -2:
    """0 = any (framed only), 1 = master->slave, 2 = slave->master."""
    if direction is None:
        return 0
    return <int> Direction(direction)


def detect_dialect(first4):
    """"framed" or "rocketmq" from a connection's first four bytes (framed length >= 24, state 1)."""
    cdef const unsigned char[::1] mv
    if len(first4) < 4:
        raise ProtocolError(f"dialect detection needs 4 bytes, got {len(first4)}")
    mv = first4
    cdef int32_t v = rd32(&mv[0])
    if v == 1:
        return "rocketmq"
    if v >= C_HDR:
        return "framed"
    raise ProtocolError(
        f"first int32 {v} of the connection is neither a framed length (>= {HEADER_SIZE}) "
        f"nor the rocketmq HANDSHAKE state 1"
    )


# --- framed: TRANSFER_DATA headers, single and batched ------------------------------------------


def pack_transfer_header(block_start_offset, epoch_start_offset, confirm_offset, data_len, epoch,
                         timestamp_ms=0):
    """The 48-byte TRANSFER_DATA header of a block of ``data_len`` bytes (data not included)."""
    cdef str where = "TRANSFER_DATA encode"
    cdef int64_t b = _i64(block_start_offset, where)
    cdef int64_t s = _i64(epoch_start_offset, where)
    cdef int64_t c = _i64(confirm_offset, where)
    cdef int64_t d = _i64(data_len, where)
    cdef int64_t e = _i64(epoch, where)
    cdef int64_t t = _i64(timestamp_ms, where)
    if d < 0 or d > C_INT32_MAX - C_TD:
        raise _perr(f"data length {d} does not fit an int32 frame length", where)
    if b < 0 or s < 0 or c < 0:
        raise _perr(f"negative offset (block {b}, epoch start {s}, confirm {c})", where)
    out = PyBytes_FromStringAndSize(NULL, C_TD)
    wr_td(<unsigned char *> PyBytes_AS_STRING(out), b, s, c, d, e, t)
    return out


cdef str _check_td(const unsigned char *p):
    # Returns None when the header is valid, else the reason (the caller adds where).
    cdef int32_t length = rd32(p)
    cdef int32_t ftype = rd32(p + 4)
    cdef int64_t b = rd64(p + 24), s = rd64(p + 32), c = rd64(p + 40)
    if ftype != 6:
        return f"type {ftype} is not TRANSFER_DATA (6)"
    if length < C_TD:
        return f"length {length} is below the {TRANSFER_HEADER_SIZE}-byte TRANSFER_DATA header"
    if b < 0 or s < 0 or c < 0:
        return f"negative offset (block {b}, epoch start {s}, confirm {c})"
    return None


def unpack_transfer_header(buf, Py_ssize_t pos=0):
    """(block_start, epoch_start, confirm, data_len, epoch, timestamp_ms) of a header at ``pos``."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef str bad
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or view.len - pos < C_TD:
            raise ProtocolError(
                f"TRANSFER_DATA header at byte {pos}: needs {TRANSFER_HEADER_SIZE} bytes, "
                f"{max(view.len - pos, 0)} available"
            )
        p = <const unsigned char *> view.buf + pos
        bad = _check_td(p)
        if bad is not None:
            raise _perr(bad, f"TRANSFER_DATA header at byte {pos}")
        return (rd64(p + 24), rd64(p + 32), rd64(p + 40), <int64_t> rd32(p) - C_TD,
                rd64(p + 16), rd64(p + 8))
    finally:
        PyBuffer_Release(&view)


@cython.boundscheck(False)
@cython.wraparound(False)
def pack_transfer_headers(const int64_t[::1] block_starts, const int64_t[::1] epoch_starts,
                          const int64_t[::1] confirm_offsets, const int64_t[::1] data_lens,
                          const int64_t[::1] epochs, const int64_t[::1] timestamps):
    """Back-to-back 48-byte TRANSFER_DATA headers; each argument an int64 buffer of equal length."""
    cdef Py_ssize_t n = block_starts.shape[0], i, bad = -1
    cdef unsigned char *out
    for name, col in (("epoch_starts", epoch_starts), ("confirm_offsets", confirm_offsets),
                      ("data_lens", data_lens), ("epochs", epochs), ("timestamps", timestamps)):
        if len(col) != n:
            raise ValueError(f"{name} has {len(col)} items, expected {n}")
    res = PyBytes_FromStringAndSize(NULL, n * C_TD)
    out = <unsigned char *> PyBytes_AS_STRING(res)
    # Every column was checked to hold n items above, so the loop indexes stay in range.
    with nogil:
        for i in range(n):
            if data_lens[i] < 0 or data_lens[i] > C_INT32_MAX - C_TD or block_starts[i] < 0 \
                    or epoch_starts[i] < 0 or confirm_offsets[i] < 0:
                bad = i
                break
            wr_td(out + i * C_TD, block_starts[i], epoch_starts[i], confirm_offsets[i],
                  data_lens[i], epochs[i], timestamps[i])
    if bad >= 0:
        where = f"TRANSFER_DATA header {bad} encode"
        if data_lens[bad] < 0 or data_lens[bad] > C_INT32_MAX - C_TD:
            raise _perr(f"data length {data_lens[bad]} does not fit an int32 frame length", where)
        raise _perr(f"negative offset (block {block_starts[bad]}, epoch start {epoch_starts[bad]}, "
                   f"confirm {confirm_offsets[bad]})", where)
    return res


@cython.boundscheck(False)
@cython.wraparound(False)
def unpack_transfer_headers(buf):
    """Columns (block_starts, epoch_starts, confirms, data_lens, epochs, timestamps) of back-to-back headers."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t n, i, bad = -1
    cdef array bs, es, co, dl, ep, ts
    cdef int64_t *cbs
    cdef int64_t *ces
    cdef int64_t *cco
    cdef int64_t *cdl
    cdef int64_t *cep
    cdef int64_t *cts
    cdef int32_t length
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len % C_TD:
            raise ProtocolError(
                f"TRANSFER_DATA headers: {view.len} bytes is not a multiple of {TRANSFER_HEADER_SIZE}"
            )
        n = view.len // C_TD
        bs = clone(_Q_TEMPLATE, n, False)
        es = clone(_Q_TEMPLATE, n, False)
        co = clone(_Q_TEMPLATE, n, False)
        dl = clone(_Q_TEMPLATE, n, False)
        ep = clone(_Q_TEMPLATE, n, False)
        ts = clone(_Q_TEMPLATE, n, False)
        cbs = <int64_t *> bs.data.as_voidptr
        ces = <int64_t *> es.data.as_voidptr
        cco = <int64_t *> co.data.as_voidptr
        cdl = <int64_t *> dl.data.as_voidptr
        cep = <int64_t *> ep.data.as_voidptr
        cts = <int64_t *> ts.data.as_voidptr
        p = <const unsigned char *> view.buf
        with nogil:
            for i in range(n):
                length = rd32(p)
                cbs[i] = rd64(p + 24)
                ces[i] = rd64(p + 32)
                cco[i] = rd64(p + 40)
                if rd32(p + 4) != 6 or length < C_TD or cbs[i] < 0 or ces[i] < 0 or cco[i] < 0:
                    bad = i
                    break
                cdl[i] = length - C_TD
                cep[i] = rd64(p + 16)
                cts[i] = rd64(p + 8)
                p += C_TD
        if bad >= 0:
            raise _perr(_check_td(<const unsigned char *> view.buf + bad * C_TD),
                       f"TRANSFER_DATA header {bad} at byte {bad * C_TD}")
        return bs, es, co, dl, ep, ts
    finally:
        PyBuffer_Release(&view)


# --- framed: encode ----------------------------------------------------------------------------


cdef bytes _hdr(int32_t length, int32_t ftype, object ts, object epoch, Py_ssize_t payload, str where):
    out = PyBytes_FromStringAndSize(NULL, C_HDR + payload)
    cdef unsigned char *p = <unsigned char *> PyBytes_AS_STRING(out)
    wr32(p, length)
    wr32(p + 4, ftype)
    wr64(p + 8, _i64(ts, where))
    wr64(p + 16, _i64(epoch, where))
    return out


cdef int64_t _nonneg64(object v, str name, str where) except? -1:
    cdef int64_t x = _i64(v, where)
    if x < 0:
        raise _perr(f"{name} {x} is outside 0..{(1 << 63) - 1}", where)
    return x


def encode_framed(frame):
    """Bytes of one framed frame; for TransferData only the header (send the data after it)."""
    cdef object t = type(frame)
    cdef str where
    cdef bytes out, addr
    cdef unsigned char *p
    cdef Py_ssize_t n, i
    cdef int32_t flags
    if t is TransferData or t is _PyTransferData:
        return pack_transfer_header(frame.block_start_offset, frame.epoch_start_offset,
                                    frame.confirm_offset, len(frame.data), frame.epoch,
                                    frame.timestamp_ms)
    where = f"{t.__name__} encode"
    if t is TransferAck or t is ConfirmTruncate:
        v = _nonneg64(frame.slave_max_offset if t is TransferAck else frame.offset,
                      "slave_max_offset" if t is TransferAck else "offset", where)
        out = _hdr(C_HDR + 8, 7 if t is TransferAck else 5, frame.timestamp_ms, frame.epoch, 8, where)
        wr64(<unsigned char *> PyBytes_AS_STRING(out) + C_HDR, v)
        return out
    if t is HandshakeSlave:
        addr = frame.address.encode("utf-8")
        seg = _nonneg64(frame.segment_bytes, "segment_bytes", where)
        bid = _i64(frame.broker_id, where)
        flags = (1 if frame.sync_from_last_file else 0) | (2 if frame.async_learner else 0)
        n = len(addr)
        if n > C_INT32_MAX - C_HDR - 24:
            raise _perr(f"address of {n} bytes does not fit one frame", where)
        out = _hdr(<int32_t> (C_HDR + 24 + n), 1, frame.timestamp_ms, frame.epoch, 24 + n, where)
        p = <unsigned char *> PyBytes_AS_STRING(out) + C_HDR
        wr32(p, flags)
        wr64(p + 4, bid)
        wr64(p + 12, seg)
        wr32(p + 20, <int32_t> n)
        memcpy(p + 24, PyBytes_AS_STRING(addr), n)
        return out
    if t is HandshakeMaster:
        mmax = _nonneg64(frame.master_max_offset, "master_max_offset", where)
        res = _i32(frame.check_result, where)
        last = _i32(frame.master_last_epoch, where)
        out = _hdr(C_HDR + 16, 2, frame.timestamp_ms, frame.epoch, 16, where)
        p = <unsigned char *> PyBytes_AS_STRING(out) + C_HDR
        wr32(p, res)
        wr64(p + 4, mmax)
        wr32(p + 12, last)
        return out
    if t is QueryEpoch:
        return _hdr(C_HDR, 3, frame.timestamp_ms, frame.epoch, 0, where)
    if t is ReturnEpoch:
        entries = frame.entries
        n = len(entries)
        if n > (C_INT32_MAX - C_HDR - 4) // C_RE_ENTRY:
            raise _perr(f"{n} epoch entries do not fit one frame", where)
        out = _hdr(<int32_t> (C_HDR + 4 + n * C_RE_ENTRY), 4, frame.timestamp_ms, frame.epoch,
                   4 + n * C_RE_ENTRY, where)
        p = <unsigned char *> PyBytes_AS_STRING(out) + C_HDR
        wr32(p, <int32_t> n)
        p += 4
        for i in range(n):
            e, s, end = entries[i]
            wr32(p, _i32(e, where))
            wr64(p + 4, _nonneg64(s, "epoch start offset", where))
            wr64(p + 12, _nonneg64(end, "epoch end offset", where))
            p += C_RE_ENTRY
        return out
    raise ProtocolError(f"encode_framed: {t.__name__} is not a framed frame type")


# --- framed: decode ----------------------------------------------------------------------------


cdef object _framed_payload(int32_t ftype, int64_t ts, int64_t epoch, object buf, object view,
                            const unsigned char *base, Py_ssize_t p, Py_ssize_t end, str where,
                            bint owned=False):
    """Decode the payload base[p:end] of a frame whose header was already validated."""
    cdef Py_ssize_t plen = end - p
    cdef const unsigned char *q = base + p
    cdef int64_t b, s, c, o, seg, bid, mmax
    cdef int32_t flags, alen, n, i
    if ftype == 6:
        if plen < 24:
            raise _perr(f"TRANSFER_DATA payload of {plen} bytes is shorter than its 24 bytes of fields", where)
        b = rd64(q)
        s = rd64(q + 8)
        c = rd64(q + 16)
        if b < 0 or s < 0 or c < 0:
            raise _perr(f"TRANSFER_DATA negative offset (block {b}, epoch start {s}, confirm {c})", where)
        return _td_decoded(b, s, c, ts, epoch, owned or type(buf) is bytes, view, base, p + 24, end)
    if ftype == 7 or ftype == 5:
        name = "TRANSFER_ACK" if ftype == 7 else "CONFIRM_TRUNCATE"
        if plen != 8:
            raise _perr(f"{name} payload is {plen} bytes, expected 8", where)
        o = rd64(q)
        if o < 0:
            raise _perr(f"{name} negative offset {o}", where)
        return TransferAck(o, ts, epoch) if ftype == 7 else ConfirmTruncate(o, ts, epoch)
    if ftype == 1:
        if plen < 24:
            raise _perr(f"HANDSHAKE_SLAVE payload of {plen} bytes is shorter than its 24 bytes of fields", where)
        flags = rd32(q)
        bid = rd64(q + 4)
        seg = rd64(q + 12)
        alen = rd32(q + 20)
        if alen != plen - 24:
            raise _perr(f"HANDSHAKE_SLAVE address length {alen} does not match the {plen - 24} bytes left", where)
        if flags & ~3:
            raise _perr(f"HANDSHAKE_SLAVE unknown flag bits 0x{flags & ~3:x}", where)
        if seg < 0:
            raise _perr(f"HANDSHAKE_SLAVE negative segment_bytes {seg}", where)
        try:
            addr = (<const char *> q + 24)[:alen].decode("utf-8")
        except UnicodeDecodeError:
            raise _perr("HANDSHAKE_SLAVE address is not UTF-8", where) from None
        return HandshakeSlave(bid, seg, addr, bool(flags & 1), bool(flags & 2), ts, epoch)
    if ftype == 2:
        if plen != 16:
            raise _perr(f"HANDSHAKE_MASTER payload is {plen} bytes, expected 16", where)
        mmax = rd64(q + 4)
        if mmax < 0:
            raise _perr(f"HANDSHAKE_MASTER negative master_max_offset {mmax}", where)
        return HandshakeMaster(rd32(q), mmax, rd32(q + 12), ts, epoch)
    if ftype == 3:
        if plen != 0:
            raise _perr(f"QUERY_EPOCH payload is {plen} bytes, expected 0", where)
        return QueryEpoch(ts, epoch)
    if ftype == 4:
        if plen < 4:
            raise _perr(f"RETURN_EPOCH payload of {plen} bytes has no count", where)
        n = rd32(q)
        if n < 0 or <int64_t> n * C_RE_ENTRY != plen - 4:
            raise _perr(f"RETURN_EPOCH count {n} does not fit the {plen - 4} bytes of entries", where)
        entries = []
        q += 4
        for i in range(n):
            s = rd64(q + 4)
            c = rd64(q + 12)
            if s < 0 or c < 0:
                raise _perr(f"RETURN_EPOCH entry at byte {p + 4 + i * C_RE_ENTRY} has a negative offset ({s}, {c})",
                           where)
            entries.append((rd32(q), s, c))
            q += C_RE_ENTRY
        return ReturnEpoch(tuple(entries), ts, epoch)
    raise _perr(f"unknown frame type {ftype}", where)


cdef int _check_framed_header(int32_t length, int32_t ftype, int direction, int64_t max_frame_bytes,
                              str where) except -1:
    if length < C_HDR:
        raise _perr(f"frame length {length} is below the {HEADER_SIZE}-byte header", where)
    if length > max_frame_bytes:
        raise _perr(f"frame length {length} exceeds max_frame_bytes {max_frame_bytes}", where)
    if ftype < 1 or ftype > 7:
        raise _perr(f"unknown frame type {ftype}", where)
    # Master->slave types are the even ones (2, 4, 6); slave->master the odd ones.
    if (direction == 1 and ftype % 2 == 1) or (direction == 2 and ftype % 2 == 0):
        raise _perr(f"frame type {FrameType(ftype).name} is not sent in this direction", where)
    return 0


def decode_framed(buf, direction=None, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES):
    """Decode exactly one whole framed frame held by ``buf``."""
    cdef int64_t m = _check_max(max_frame_bytes)
    cdef int d = _direction(direction)
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef int32_t length, ftype
    cdef str where = "framed frame at byte 0"
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len < C_HDR:
            raise ProtocolError(
                f"framed frame at byte 0: {view.len} bytes is shorter than the {HEADER_SIZE}-byte header")
        p = <const unsigned char *> view.buf
        length = rd32(p)
        ftype = rd32(p + 4)
        _check_framed_header(length, ftype, d, m, where)
        if length != view.len:
            raise _perr(f"frame length {length} does not match the {view.len} bytes given", where)
        mv = memoryview(buf) if type(buf) is bytes else None
        return _framed_payload(ftype, rd64(p + 8), rd64(p + 16), buf, mv if mv is not None else memoryview(buf),
                               p, C_HDR, view.len, where)
    finally:
        PyBuffer_Release(&view)


# --- framed: the slave's receive run and its ack -------------------------------------------------

cdef enum:
    C_RUN_END = 0
    C_RUN_PARTIAL = 1
    C_RUN_OTHER = 2

RUN_END = C_RUN_END
RUN_PARTIAL = C_RUN_PARTIAL
RUN_OTHER = C_RUN_OTHER


def pack_transfer_ack(slave_max_offset, timestamp_ms, epoch):
    """The 32-byte TRANSFER_ACK frame: ``encode_framed(TransferAck(...))`` in one call."""
    cdef str where = "TransferAck encode"
    cdef int64_t off = _nonneg64(slave_max_offset, "slave_max_offset", where)
    out = _hdr(C_HDR + 8, 7, timestamp_ms, epoch, 8, where)
    wr64(<unsigned char *> PyBytes_AS_STRING(out) + C_HDR, off)
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
def scan_transfer_run(buf, Py_ssize_t start, Py_ssize_t end, max_frame_bytes, Py_ssize_t tag_bytes,
                      int64_t log_end, int64_t epoch, int64_t epoch_start, int64_t segment_bytes):
    """The run of plain TRANSFER_DATA frames at ``buf[start:end]`` (frames_py's docstring)."""
    cdef int64_t max_frame = _check_max(max_frame_bytes)
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t pos, n = 0, cap
    cdef int32_t length
    cdef int64_t size, block, confirm, at = log_end, learnt = -1, capped
    cdef int stop = 0
    cdef Py_ssize_t need = 0
    cdef array spans
    cdef int64_t *out
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if segment_bytes <= 0 or tag_bytes < 0 or log_end < 0 or start < 0 or end > view.len or start > end:
            raise ValueError(f"scan_transfer_run: bad arguments (buffer {start}..{end} of {view.len}, "
                             f"tag {tag_bytes}, segment {segment_bytes})")
        # At most one frame per 49 + tag bytes: three slots each, cut to size at the end.
        cap = 3 * ((end - start) // (C_TD + 1 + tag_bytes) + 1)
        spans = clone(_Q_TEMPLATE, cap, False)
        out = <int64_t *> spans.data.as_voidptr
        p = <const unsigned char *> view.buf
        pos = start
        with nogil:
            while end - pos >= 8:
                length = rd32(p + pos)
                if rd32(p + pos + 4) != 6 or length < C_TD or length > max_frame:
                    stop = C_RUN_OTHER
                    break
                if end - pos < <Py_ssize_t> length + tag_bytes:
                    stop = C_RUN_PARTIAL
                    need = <Py_ssize_t> length + tag_bytes
                    break
                size = length - C_TD
                block = rd64(p + pos + 24)
                confirm = rd64(p + pos + 40)
                if (size == 0 or block != at or rd64(p + pos + 16) != epoch
                        or rd64(p + pos + 32) != epoch_start or epoch_start > block or confirm < 0
                        or block + size > block - block % segment_bytes + segment_bytes):
                    stop = C_RUN_OTHER
                    break
                at = block + size
                capped = confirm if confirm < at else at
                if capped > learnt:
                    learnt = capped
                out[3 * n] = pos + C_TD
                out[3 * n + 1] = size
                out[3 * n + 2] = learnt
                n += 1
                pos += length + tag_bytes
        if stop == C_RUN_OTHER:
            return C_RUN_OTHER, clone(_Q_TEMPLATE, 0, False), 0, 0
        resize(spans, 3 * n)
        return stop, spans, pos - start, need
    finally:
        PyBuffer_Release(&view)


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
def scan_transfer_acks(buf, Py_ssize_t tag_bytes, int64_t acked, int64_t sent, int64_t last_epoch):
    """A read of an HA master made only of whole, sensible TRANSFER_ACK frames (frames_py's docstring)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t step, pos, n
    cdef int64_t last = acked, offset
    if tag_bytes < 0:
        raise ValueError(f"scan_transfer_acks: negative tag length {tag_bytes}")
    step = C_HDR + 8 + tag_bytes
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        n = view.len
        if n == 0 or n % step:
            return -1, acked
        p = <const unsigned char *> view.buf
        pos = 0
        while pos < n:
            offset = rd64(p + pos + C_HDR)
            if (rd32(p + pos) != C_HDR + 8 or rd32(p + pos + 4) != 7 or offset < 0 or offset < last
                    or offset > sent or rd64(p + pos + 16) > last_epoch):
                return -1, acked
            last = offset
            pos += step
        return n // step, last
    finally:
        PyBuffer_Release(&view)


# --- rocketmq: encode --------------------------------------------------------------------------


def pack_rocketmq_transfer_header(offset, epoch, epoch_start_offset, confirm_offset, body_size):
    """The 36-byte master transfer header of a body of ``body_size`` bytes (body not included)."""
    cdef str where = "rocketmq transfer encode"
    cdef int64_t o = _i64(offset, where)
    cdef int64_t s = _i64(epoch_start_offset, where)
    cdef int64_t c = _i64(confirm_offset, where)
    cdef int64_t b = _i64(body_size, where)
    cdef int32_t e = _i32(epoch, where)
    cdef int64_t lo
    cdef unsigned char *p
    if b < 0 or b > C_INT32_MAX - C_RMQ_TRANSFER:
        raise _perr(f"body size {b} does not fit an int32", where)
    lo = -1 if b == 0 else 0
    if o < lo or s < lo or c < -1:
        raise _perr(f"negative offset (offset {o}, epoch start {s}, confirm {c})", where)
    out = PyBytes_FromStringAndSize(NULL, C_RMQ_TRANSFER)
    p = <unsigned char *> PyBytes_AS_STRING(out)
    wr32(p, 2)
    wr32(p + 4, <int32_t> b)
    wr64(p + 8, o)
    wr32(p + 16, e)
    wr64(p + 20, s)
    wr64(p + 28, c)
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def pack_rocketmq_transfer_headers(const int64_t[::1] offsets, const int64_t[::1] epochs,
                                   const int64_t[::1] epoch_starts, const int64_t[::1] confirm_offsets,
                                   const int64_t[::1] body_sizes):
    """Back-to-back 36-byte master transfer headers; each argument an int64 buffer of equal length."""
    cdef Py_ssize_t n = offsets.shape[0], i, bad = -1
    cdef int64_t lo, b
    cdef unsigned char *p
    for name, col in (("epochs", epochs), ("epoch_starts", epoch_starts),
                      ("confirm_offsets", confirm_offsets), ("body_sizes", body_sizes)):
        if len(col) != n:
            raise ValueError(f"{name} has {len(col)} items, expected {n}")
    res = PyBytes_FromStringAndSize(NULL, n * C_RMQ_TRANSFER)
    p = <unsigned char *> PyBytes_AS_STRING(res)
    # Every column was checked to hold n items above, so the loop indexes stay in range.
    with nogil:
        for i in range(n):
            b = body_sizes[i]
            lo = -1 if b == 0 else 0
            if b < 0 or b > C_INT32_MAX - C_RMQ_TRANSFER or offsets[i] < lo or epoch_starts[i] < lo \
                    or confirm_offsets[i] < -1 or epochs[i] < -2147483648 or epochs[i] > C_INT32_MAX:
                bad = i
                break
            wr32(p, 2)
            wr32(p + 4, <int32_t> b)
            wr64(p + 8, offsets[i])
            wr32(p + 16, <int32_t> epochs[i])
            wr64(p + 20, epoch_starts[i])
            wr64(p + 28, confirm_offsets[i])
            p += C_RMQ_TRANSFER
    if bad >= 0:
        where = f"rocketmq transfer header {bad} encode"
        b = body_sizes[bad]
        if b < 0 or b > C_INT32_MAX - C_RMQ_TRANSFER:
            raise _perr(f"body size {b} does not fit an int32", where)
        lo = -1 if b == 0 else 0
        if offsets[bad] < lo or epoch_starts[bad] < lo or confirm_offsets[bad] < -1:
            raise _perr(f"negative offset (offset {offsets[bad]}, epoch start {epoch_starts[bad]}, "
                        f"confirm {confirm_offsets[bad]})", where)
        raise _perr(f"epoch {epochs[bad]} does not fit an int32", where)
    return res


def encode_rocketmq(frame):
    """Bytes of one rocketmq-dialect message; for RmqMasterTransfer only the 36-byte header."""
    cdef object t = type(frame)
    cdef str where
    cdef unsigned char *p
    cdef Py_ssize_t n, i
    cdef int32_t state
    if t is RmqMasterTransfer:
        return pack_rocketmq_transfer_header(frame.offset, frame.epoch, frame.epoch_start_offset,
                                             frame.confirm_offset, len(frame.data))
    where = f"{t.__name__} encode"
    if t is RmqSlaveAck:
        o = _nonneg64(frame.max_offset, "max_offset", where)
        out = PyBytes_FromStringAndSize(NULL, C_RMQ_ACK)
        p = <unsigned char *> PyBytes_AS_STRING(out)
        wr32(p, 2)
        wr64(p + 4, o)
        return out
    if t is RmqSlaveHandshake:
        bid = _i64(frame.broker_id, where)
        out = PyBytes_FromStringAndSize(NULL, C_RMQ_HS_SLAVE)
        p = <unsigned char *> PyBytes_AS_STRING(out)
        wr32(p, 1)
        wr16(p + 4, 1 if frame.sync_from_last_file else 0)
        wr16(p + 6, 1 if frame.async_learner else 0)
        wr64(p + 8, bid)
        return out
    if t is RmqMasterHandshake:
        mmax = _nonneg64(frame.max_offset, "max_offset", where)
        state = _i32(int(frame.state), where)
        if state != 1:
            raise _perr(f"master handshake state {state} is not HANDSHAKE (1)", where)
        last = _i32(frame.last_epoch, where)
        entries = frame.entries
        n = len(entries)
        if n > (C_INT32_MAX - C_RMQ_HS_MASTER) // C_RMQ_ENTRY:
            raise _perr(f"{n} epoch entries do not fit one handshake", where)
        out = PyBytes_FromStringAndSize(NULL, C_RMQ_HS_MASTER + n * C_RMQ_ENTRY)
        p = <unsigned char *> PyBytes_AS_STRING(out)
        wr32(p, state)
        wr32(p + 4, <int32_t> (n * C_RMQ_ENTRY))
        wr64(p + 8, mmax)
        wr32(p + 16, last)
        p += C_RMQ_HS_MASTER
        for i in range(n):
            e, s = entries[i]
            wr32(p, _i32(e, where))
            wr64(p + 4, _nonneg64(s, "epoch start offset", where))
            p += C_RMQ_ENTRY
        return out
    raise ProtocolError(f"encode_rocketmq: {t.__name__} is not a rocketmq frame type")


# --- rocketmq: decode --------------------------------------------------------------------------


cdef Py_ssize_t _rmq_need(const unsigned char *p, Py_ssize_t avail, int direction,
                          int64_t max_frame_bytes, str where) except -1:
    """Total size of the message at p once known, 0 if more bytes are needed (avail >= 4)."""
    cdef int32_t state = rd32(p)
    cdef int32_t body
    cdef Py_ssize_t hdr
    if direction == 2:
        if state == 1:
            return C_RMQ_HS_SLAVE
        if state == 2:
            return C_RMQ_ACK
        raise _perr(f"slave state {state} is neither HANDSHAKE (1) nor TRANSFER (2)", where)
    if state == 1:
        hdr = C_RMQ_HS_MASTER
    elif state == 2:
        hdr = C_RMQ_TRANSFER
    else:
        raise _perr(f"master state {state} is neither HANDSHAKE (1) nor TRANSFER (2)", where)
    if avail < 8:
        return 0
    body = rd32(p + 4)
    if body < 0 or body > max_frame_bytes - hdr:
        raise _perr(f"body size {body} is outside 0..{max_frame_bytes - hdr} (max_frame_bytes {max_frame_bytes})",
                   where)
    if state == 1 and body % C_RMQ_ENTRY:
        raise _perr(f"handshake body size {body} is not a multiple of {RMQ_EPOCH_ENTRY_SIZE}", where)
    return hdr + body


cdef object _rmq_message(object buf, object view, const unsigned char *base, Py_ssize_t p, Py_ssize_t end,
                         int direction, str where, bint owned=False):
    cdef const unsigned char *q = base + p
    cdef int32_t state = rd32(q)
    cdef int16_t sync, learner
    cdef int64_t off, estart, confirm, mmax, s, lo
    cdef int32_t body
    cdef Py_ssize_t k
    if direction == 2:
        if state == 1:
            sync = rd16(q + 4)
            learner = rd16(q + 6)
            if (sync != 0 and sync != 1) or (learner != 0 and learner != 1):
                raise _perr(f"handshake flags ({sync}, {learner}) are not 0/1", where)
            return RmqSlaveHandshake(rd64(q + 8), sync == 1, learner == 1)
        off = rd64(q + 4)
        if off < 0:
            raise _perr(f"ack negative max_offset {off}", where)
        return RmqSlaveAck(off)
    if state == 1:
        mmax = rd64(q + 8)
        if mmax < 0:
            raise _perr(f"handshake negative max_offset {mmax}", where)
        entries = []
        for k in range(p + C_RMQ_HS_MASTER, end, C_RMQ_ENTRY):
            s = rd64(base + k + 4)
            if s < 0:
                raise _perr(f"handshake epoch entry at byte {k} has negative start {s}", where)
            entries.append((rd32(base + k), s))
        return RmqMasterHandshake(mmax, rd32(q + 16), tuple(entries), 1)
    body = rd32(q + 4)
    off = rd64(q + 8)
    estart = rd64(q + 20)
    confirm = rd64(q + 28)
    lo = -1 if body == 0 else 0  # RocketMQ heartbeats of an empty master carry -1
    if off < lo or estart < lo or confirm < -1:
        raise _perr(f"transfer negative offset (offset {off}, epoch start {estart}, confirm {confirm})", where)
    return RmqMasterTransfer(off, rd32(q + 16), estart, confirm, _data_of(buf, view, p + C_RMQ_TRANSFER, end, owned))


def decode_rocketmq(buf, direction, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES):
    """Decode exactly one whole rocketmq-dialect message sent in ``direction``."""
    cdef int64_t m = _check_max(max_frame_bytes)
    cdef int d = <int> Direction(direction)
    cdef Py_buffer view
    cdef Py_ssize_t need
    cdef str where = "rocketmq message at byte 0"
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len < 4:
            raise _perr(f"{view.len} bytes is shorter than the state field", where)
        need = _rmq_need(<const unsigned char *> view.buf, view.len, d, m, where)
        if need == 0 or need > view.len:
            raise _perr(f"message needs {need or 8} bytes, {view.len} given", where)
        if need != view.len:
            raise _perr(f"message is {need} bytes, {view.len} given", where)
        return _rmq_message(buf, memoryview(buf), <const unsigned char *> view.buf, 0, view.len, d, where)
    finally:
        PyBuffer_Release(&view)


# --- incremental decoders ----------------------------------------------------------------------


cdef class _StreamDecoder:
    """Whole frames inside a chunk are parsed in place; a frame cut across chunks is assembled
    in a bytearray that never grows beyond the validated frame size."""

    cdef readonly int64_t max_frame_bytes
    cdef readonly object direction
    cdef int _dir
    cdef bytearray _pending
    cdef Py_ssize_t _need
    cdef int64_t _offset
    cdef object _failed
    cdef bint _rmq

    def __init__(self, direction=None, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES):
        self.max_frame_bytes = _check_max(max_frame_bytes)
        self._pending = bytearray()
        self._need = 0
        self._offset = 0
        self._failed = None
        self._setup(direction)

    def _setup(self, direction):
        # A cdef class cannot be an ABC: refuse the bare base class plainly instead.
        raise TypeError(f"{type(self).__name__} is a base class; use FramedDecoder or RocketMQDecoder")

    @property
    def buffered(self):
        """Bytes of an incomplete frame held back."""
        return len(self._pending)

    @property
    def stream_offset(self):
        """Stream offset of the first byte of the frame being assembled."""
        return self._offset

    cdef str _where(self):
        if self._rmq:
            return f"rocketmq message at stream offset {self._offset}"
        return f"framed frame at stream offset {self._offset}"

    cdef Py_ssize_t _size(self, const unsigned char *p, Py_ssize_t avail) except -1:
        cdef int32_t length, ftype
        if self._rmq:
            if avail < 4:
                return 0
            return _rmq_need(p, avail, self._dir, self.max_frame_bytes, self._where())
        if avail < 8:
            return 0
        length = rd32(p)
        ftype = rd32(p + 4)
        # Inline fast accept of the common case; the full check builds the error message.
        if length < C_HDR or length > self.max_frame_bytes or ftype < 1 or ftype > 7 \
                or (self._dir == 1 and ftype % 2 == 1) or (self._dir == 2 and ftype % 2 == 0):
            _check_framed_header(length, ftype, self._dir, self.max_frame_bytes, self._where())
        return length

    cdef object _frame(self, object buf, object view, const unsigned char *base, Py_ssize_t pos,
                       Py_ssize_t size, bint owned):
        cdef const unsigned char *p = base + pos
        cdef int32_t ftype
        cdef int64_t b, s, c, o
        if self._rmq:
            return _rmq_message(buf, view, base, pos, pos + size, self._dir, self._where(), owned)
        ftype = rd32(p + 4)
        # Fast paths for the two frames of the transfer phase; the rest share the full decoder.
        if ftype == 6 and size >= C_TD:
            b = rd64(p + 24)
            s = rd64(p + 32)
            c = rd64(p + 40)
            if b >= 0 and s >= 0 and c >= 0:
                return _td_decoded(b, s, c, rd64(p + 8), rd64(p + 16), owned or type(buf) is bytes, view,
                                   base, pos + C_TD, pos + size)
        elif ftype == 7 and size == C_HDR + 8:
            o = rd64(p + C_HDR)
            if o >= 0:
                return TransferAck(o, rd64(p + 8), rd64(p + 16))
        return _framed_payload(ftype, rd64(p + 8), rd64(p + 16), buf, view, base, pos + C_HDR, pos + size,
                               self._where(), owned)

    def feed(self, chunk):
        """Frames completed by ``chunk`` (any size, possibly empty), in stream order."""
        if self._failed is not None:
            raise ProtocolError(f"decoder stopped after an earlier error: {self._failed}")
        try:
            return self._feed(chunk)
        except ProtocolError as exc:
            self._failed = exc
            raise

    cdef int _take(self, const unsigned char *src, Py_ssize_t n) except -1:
        # Append n bytes straight from the chunk: no intermediate bytes object.
        cdef Py_ssize_t old = PyByteArray_GET_SIZE(self._pending)
        PyByteArray_Resize(self._pending, old + n)
        memcpy(PyByteArray_AS_STRING(self._pending) + old, src, n)
        return 0

    cdef list _feed(self, object chunk):
        cdef list out = []
        cdef Py_buffer cv
        cdef const unsigned char *cp
        cdef Py_ssize_t n, pos = 0, take, size, hint, have
        cdef bytearray whole
        hint = 8 if self._rmq else C_HDR
        PyObject_GetBuffer(chunk, &cv, PyBUF_SIMPLE)
        try:
            n = cv.len
            cp = <const unsigned char *> cv.buf
            while PyByteArray_GET_SIZE(self._pending):
                # Complete the frame cut at the previous chunk boundary.
                have = PyByteArray_GET_SIZE(self._pending)
                if not self._need:
                    self._need = self._size(<const unsigned char *> PyByteArray_AS_STRING(self._pending), have)
                    if not self._need:
                        take = min(n - pos, hint - have)
                        if take <= 0:
                            return out
                        self._take(cp + pos, take)
                        pos += take
                        continue
                take = min(n - pos, self._need - have)
                if take > 0:
                    if n - pos - take >= C_TD:
                        # The next frame's header: its load overlaps the copy below.
                        prefetch(cp + pos + take)
                        prefetch(cp + pos + take + C_TD - 1)
                    self._take(cp + pos, take)
                    pos += take
                if PyByteArray_GET_SIZE(self._pending) < self._need:
                    return out
                # Hand the assembled buffer to the frame (its data is a view of it) and start
                # a new one, so the frame's bytes are copied once, from the chunks into it.
                whole = self._pending
                self._pending = bytearray()
                out.append(self._frame(whole, memoryview(whole),
                                       <const unsigned char *> PyByteArray_AS_STRING(whole), 0, self._need, True))
                self._offset += self._need
                self._need = 0
            if pos >= n:
                return out
            view = memoryview(chunk)
            while pos < n:
                size = self._size(cp + pos, n - pos)
                if not size or size > n - pos:
                    self._take(cp + pos, n - pos)
                    self._need = size
                    return out
                if n - pos - size >= C_TD:
                    # Frames are KiBs apart, so the next header is a cache miss: start loading
                    # it now and build this frame while it arrives.  A hint: reads nothing.
                    prefetch(cp + pos + size)
                    prefetch(cp + pos + size + C_TD - 1)
                out.append(self._frame(chunk, view, cp, pos, size, False))
                self._offset += size
                pos += size
            return out
        finally:
            PyBuffer_Release(&cv)


cdef class FramedDecoder(_StreamDecoder):
    """Incremental decoder of the framed dialect; ``direction`` None accepts every type."""

    def _setup(self, direction):
        self._rmq = False
        self.direction = None if direction is None else Direction(direction)
        self._dir = _direction(direction)


cdef class RocketMQDecoder(_StreamDecoder):
    """Incremental decoder of the rocketmq dialect for one direction."""

    def _setup(self, direction):
        if direction is None:
            raise ValueError("the rocketmq dialect needs a direction (its state 2 means ack or transfer)")
        self._rmq = True
        self.direction = Direction(direction)
        self._dir = _direction(direction)
