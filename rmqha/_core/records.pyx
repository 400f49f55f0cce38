# cython: language_level=3
"""RocketMQ v1 message records, compiled twin (same API and bytes as ``records_py.py``).

The layout is documented in ``records_py.py``.  This twin encodes whole batches in one C
loop straight into the target buffer (the segment's mmap): a header template built once
per call is copied and four fields patched per record, the body is memcpy-ed, and the body
CRC uses PCLMULQDQ folding when the CPU has it (slicing-by-8 tables otherwise).  No Python
object is created per record.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from libc.stdint cimport int16_t, uint16_t, uint32_t, int32_t, int64_t, uint64_t
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcmp, memcpy, memset

from rmqha.errors import CorruptRecordError, InvalidMessageError, MessageTooLargeError, StoreError
# Not hot: property maps and the stop-reason enum are shared with the pure twin.
from rmqha._core.records_py import ScanStop, encode_properties, decode_properties
# The refusals of a record that would end in a zero byte: the same words in both twins.
from rmqha._core.records_py import _NUL_TOPIC, _nul_property

cdef extern from "Python.h":
    ctypedef struct PyObject
    PyObject* _list_item "PyList_GET_ITEM"(object, Py_ssize_t)
    bint _bytes_check "PyBytes_CheckExact"(PyObject*)
    char* _bytes_data "PyBytes_AS_STRING"(PyObject*)
    Py_ssize_t _bytes_size "PyBytes_GET_SIZE"(PyObject*)
    object PyBytes_FromStringAndSize(const char*, Py_ssize_t)

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    #include <unistd.h>
    #endif

    #define C_MESSAGE_MAGIC 0xDAA320A7u
    #define C_BLANK_MAGIC 0xCBD43194u
    #define C_FIXED 91
    #define C_HEAD 88
    #define C_MIN_BLANK 8
    #define C_MAX_BODY (0x7FFFFFFF - 91 - 255 - 32767)

    static uint32_t rmqha_crc_tab[8][256];
    static int rmqha_have_clmul = 0;
    static int rmqha_have_vclmul_flag = 0;

    static void rmqha_crc_init(void) {
        uint32_t n, c;
        int k;
        for (n = 0; n < 256; n++) {
            c = n;
            for (k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : (c >> 1);
            rmqha_crc_tab[0][n] = c;
        }
        for (n = 0; n < 256; n++) {
            c = rmqha_crc_tab[0][n];
            for (k = 1; k < 8; k++) {
                c = rmqha_crc_tab[0][c & 0xffu] ^ (c >> 8);
                rmqha_crc_tab[k][n] = c;
            }
        }
    #if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        rmqha_have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        rmqha_have_vclmul_flag = rmqha_have_clmul && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
    #endif
    }

    /* c is the running (inverted) register, as inside zlib. */
    static uint32_t rmqha_crc_sb8(uint32_t c, const unsigned char *p, size_t n) {
        while (n >= 8) {
            uint32_t a = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                              (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 |
                         (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
            c = rmqha_crc_tab[7][a & 0xffu] ^ rmqha_crc_tab[6][(a >> 8) & 0xffu] ^
                rmqha_crc_tab[5][(a >> 16) & 0xffu] ^ rmqha_crc_tab[4][a >> 24] ^
                rmqha_crc_tab[3][b & 0xffu] ^ rmqha_crc_tab[2][(b >> 8) & 0xffu] ^
                rmqha_crc_tab[1][(b >> 16) & 0xffu] ^ rmqha_crc_tab[0][b >> 24];
            p += 8;
            n -= 8;
        }
        while (n--) c = rmqha_crc_tab[0][(c ^ *p++) & 0xffu] ^ (c >> 8);
        return c;
    }

    #if defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    #define rmqha_have_vclmul rmqha_have_vclmul_flag

    /* Carry-less multiply folding (Intel's "Fast CRC computation for generic polynomials
       using PCLMULQDQ") for the bit-reflected CRC-32 polynomial.  Fold constants are
       (x^(D+32) mod P)' << 1 and (x^(D-32) mod P)' << 1 (' = 32-bit reflection) for a
       folding distance of D bits.  With d != NULL every block is also stored to d: copy
       and CRC in one pass. */
    #define RMQHA_FOLD(x, k, next) \
        t = _mm_clmulepi64_si128(x, k, 0x00); \
        x = _mm_clmulepi64_si128(x, k, 0x11); \
        x = _mm_xor_si128(_mm_xor_si128(x, t), next);

    /* Four 128-bit accumulators covering the last 64 bytes -> the CRC of everything,
       after folding in the remaining n (multiple of 16) bytes. */
    __attribute__((target("pclmul,sse4.1")))
    static uint32_t rmqha_clmul_finish(__m128i x0, __m128i x1, __m128i x2, __m128i x3,
                                       unsigned char *d, const unsigned char *p, size_t n) {
        const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
        const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
        const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
        const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
        __m128i y0, t;
        RMQHA_FOLD(x0, k34, x1)
        RMQHA_FOLD(x0, k34, x2)
        RMQHA_FOLD(x0, k34, x3)
        while (n >= 16) {
            y0 = _mm_loadu_si128((const __m128i *)p);
            if (d) {
                _mm_storeu_si128((__m128i *)d, y0);
                d += 16;
            }
            RMQHA_FOLD(x0, k34, y0)
            p += 16;
            n -= 16;
        }
        /* 128 -> 64 bits (appends 32 zero bits), then 64 -> 32 with a Barrett reduction. */
        t = _mm_clmulepi64_si128(x0, k34, 0x10);
        x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
        t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00);
        x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), t);
        t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly, 0x10);
        t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
        x0 = _mm_xor_si128(x0, t);
        return (uint32_t)_mm_extract_epi32(x0, 1);
    }

    /* n >= 64, n % 16 == 0: four xmm accumulators fold 64 bytes per step (D = 512). */
    __attribute__((target("pclmul,sse4.1")))
    static uint32_t rmqha_crc_clmul(uint32_t c, unsigned char *d, const unsigned char *p,
                                    size_t n) {
        const __m128i k12 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
        __m128i x0, x1, x2, x3, y0, y1, y2, y3, t;
    #define RMQHA_LOAD4(y0, y1, y2, y3) \
        y0 = _mm_loadu_si128((const __m128i *)p); \
        y1 = _mm_loadu_si128((const __m128i *)(p + 16)); \
        y2 = _mm_loadu_si128((const __m128i *)(p + 32)); \
        y3 = _mm_loadu_si128((const __m128i *)(p + 48)); \
        if (d) { \
            _mm_storeu_si128((__m128i *)d, y0); \
            _mm_storeu_si128((__m128i *)(d + 16), y1); \
            _mm_storeu_si128((__m128i *)(d + 32), y2); \
            _mm_storeu_si128((__m128i *)(d + 48), y3); \
            d += 64; \
        } \
        p += 64; \
        n -= 64;
        RMQHA_LOAD4(x0, x1, x2, x3)
        x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
        while (n >= 64) {
            RMQHA_LOAD4(y0, y1, y2, y3)
            RMQHA_FOLD(x0, k12, y0)
            RMQHA_FOLD(x1, k12, y1)
            RMQHA_FOLD(x2, k12, y2)
            RMQHA_FOLD(x3, k12, y3)
        }
    #undef RMQHA_LOAD4
        return rmqha_clmul_finish(x0, x1, x2, x3, d, p, n);
    }

    /* n >= 256, n % 16 == 0: the same folding with 512-bit VPCLMULQDQ; four zmm
       accumulators fold 256 bytes per step (D = 2048), then one zmm folds 64 bytes per
       step (D = 512, each 128-bit lane like one xmm accumulator above). */
    __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.1")))
    static uint32_t rmqha_crc_vclmul(uint32_t c, unsigned char *d, const unsigned char *p,
                                     size_t n) {
        const __m512i k2048 = _mm512_broadcast_i32x4(
            _mm_set_epi64x(0x1322d1430LL, 0x11542778aLL));
        const __m512i k512 = _mm512_broadcast_i32x4(
            _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL));
        __m512i z0, z1, z2, z3, y0, y1, y2, y3, t;
    #define RMQHA_ZLOAD(y, off) \
        y = _mm512_loadu_si512((const void *)(p + off)); \
        if (d) _mm512_storeu_si512((void *)(d + off), y);
    #define RMQHA_ZFOLD(z, k, next) \
        t = _mm512_clmulepi64_epi128(z, k, 0x00); \
        z = _mm512_clmulepi64_epi128(z, k, 0x11); \
        z = _mm512_ternarylogic_epi64(z, t, next, 0x96);
        RMQHA_ZLOAD(z0, 0)
        RMQHA_ZLOAD(z1, 64)
        RMQHA_ZLOAD(z2, 128)
        RMQHA_ZLOAD(z3, 192)
        z0 = _mm512_xor_si512(z0, _mm512_inserti32x4(_mm512_setzero_si512(),
                                                     _mm_cvtsi32_si128((int)c), 0));
        p += 256;
        if (d) d += 256;
        n -= 256;
        while (n >= 256) {
            RMQHA_ZLOAD(y0, 0)
            RMQHA_ZLOAD(y1, 64)
            RMQHA_ZLOAD(y2, 128)
            RMQHA_ZLOAD(y3, 192)
            RMQHA_ZFOLD(z0, k2048, y0)
            RMQHA_ZFOLD(z1, k2048, y1)
            RMQHA_ZFOLD(z2, k2048, y2)
            RMQHA_ZFOLD(z3, k2048, y3)
            p += 256;
            if (d) d += 256;
            n -= 256;
        }
        RMQHA_ZFOLD(z0, k512, z1)
        RMQHA_ZFOLD(z0, k512, z2)
        RMQHA_ZFOLD(z0, k512, z3)
        while (n >= 64) {
            RMQHA_ZLOAD(y0, 0)
            RMQHA_ZFOLD(z0, k512, y0)
            p += 64;
            if (d) d += 64;
            n -= 64;
        }
    #undef RMQHA_ZLOAD
    #undef RMQHA_ZFOLD
        return rmqha_clmul_finish(_mm512_extracti32x4_epi32(z0, 0),
                                  _mm512_extracti32x4_epi32(z0, 1),
                                  _mm512_extracti32x4_epi32(z0, 2),
                                  _mm512_extracti32x4_epi32(z0, 3), d, p, n);
    }
    #undef RMQHA_FOLD

    /* Folds whole 16-byte blocks of p (copying them to d when d != NULL) with the widest
       carry-less multiply available; returns the register and advances the pointers. */
    static uint32_t rmqha_crc_blocks(uint32_t c, unsigned char **d, const unsigned char **p,
                                     size_t *n) {
        size_t m = *n & ~(size_t)15;
        if (rmqha_have_vclmul && m >= 256) {
            c = rmqha_crc_vclmul(c, *d, *p, m);
        } else if (rmqha_have_clmul && m >= 64) {
            c = rmqha_crc_clmul(c, *d, *p, m);
        } else {
            return c;
        }
        *p += m;
        if (*d) *d += m;
        *n -= m;
        return c;
    }
    #endif

    /* zlib.crc32(data, crc) */
    static uint32_t rmqha_crc32(uint32_t crc, const unsigned char *p, size_t n) {
        uint32_t c = ~crc;
    #if defined(__x86_64__) && defined(__GNUC__)
        unsigned char *none = NULL;
        c = rmqha_crc_blocks(c, &none, &p, &n);
    #endif
        return ~rmqha_crc_sb8(c, p, n);
    }

    /* memcpy(d, p, n) and return zlib.crc32(p, crc), reading p once. */
    static uint32_t rmqha_crc32_copy(uint32_t crc, unsigned char *d, const unsigned char *p,
                                     size_t n) {
        uint32_t c = ~crc;
    #if defined(__x86_64__) && defined(__GNUC__)
        c = rmqha_crc_blocks(c, &d, &p, &n);
    #endif
        memcpy(d, p, n);
        return ~rmqha_crc_sb8(c, p, n);
    }

    static inline void rmqha_put32(unsigned char *p, uint32_t v) {
        p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
        p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
    }
    static inline void rmqha_put64(unsigned char *p, uint64_t v) {
        rmqha_put32(p, (uint32_t)(v >> 32));
        rmqha_put32(p + 4, (uint32_t)v);
    }
    static inline uint32_t rmqha_get32(const unsigned char *p) {
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
    }
    static inline uint64_t rmqha_get64(const unsigned char *p) {
        return (uint64_t)rmqha_get32(p) << 32 | (uint64_t)rmqha_get32(p + 4);
    }

    /* 1 when the pages holding p[0] and p[n-1] are in memory (mincore), else 0; 1 where
       the kernel cannot tell (no mincore): callers treat "unknown" as "warm". */
    static int rmqha_resident(unsigned char *p, size_t n) {
    #if defined(__linux__)
        long page = sysconf(_SC_PAGESIZE);
        unsigned char vec = 0;
        uintptr_t first = (uintptr_t)p & ~((uintptr_t)page - 1);
        uintptr_t last = ((uintptr_t)p + (n ? n - 1 : 0)) & ~((uintptr_t)page - 1);
        if (mincore((void *)last, (size_t)page, &vec) != 0) return 1;
        if (!(vec & 1)) return 0;
        if (mincore((void *)first, (size_t)page, &vec) != 0) return 1;
        return vec & 1;
    #else
        (void)p; (void)n;
        return 1;
    #endif
    }

    /* Fault every page in without changing a byte (the next segment may already take
       writes from another thread, so plain stores are not allowed).  0 on success. */
    static int rmqha_prefault(unsigned char *p, size_t n) {
        size_t i;
    #if defined(__linux__)
        long page = sysconf(_SC_PAGESIZE);
        uintptr_t start = (uintptr_t)p & ~((uintptr_t)page - 1);
        /* MADV_POPULATE_WRITE (Linux 5.14+) */
        if (madvise((void *)start, n + ((uintptr_t)p - start), 23) == 0) return 0;
    #endif
    #if defined(__GNUC__)
        for (i = 0; i < n; i += 4096) __atomic_fetch_or(p + i, (unsigned char)0, __ATOMIC_RELAXED);
    #else
        for (i = 0; i < n; i += 4096) (void)*(volatile unsigned char *)(p + i);
    #endif
        return 1;
    }
    """
    void rmqha_crc_init() nogil
    uint32_t rmqha_crc32(uint32_t crc, const unsigned char *p, size_t n) nogil
    uint32_t rmqha_crc32_copy(uint32_t crc, unsigned char *d, const unsigned char *p,
                              size_t n) nogil
    void rmqha_put32(unsigned char *p, uint32_t v) nogil
    void rmqha_put64(unsigned char *p, uint64_t v) nogil
    uint32_t rmqha_get32(const unsigned char *p) nogil
    uint64_t rmqha_get64(const unsigned char *p) nogil
    int rmqha_prefault(unsigned char *p, size_t n) nogil
    int rmqha_resident(unsigned char *p, size_t n) nogil
    int rmqha_have_clmul
    int rmqha_have_vclmul_flag
    const uint32_t C_MESSAGE_MAGIC
    const uint32_t C_BLANK_MAGIC
    enum:
        C_FIXED
        C_HEAD
        C_MIN_BLANK
        C_MAX_BODY

rmqha_crc_init()

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
FIXED_SIZE = 91
MIN_BLANK = 8
MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 32767
MAX_BODY_BYTES = 0x7FFFFFFF - 91 - 255 - 32767
CRC_MASK = 0x7FFFFFFF
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
#: Whether the CRC uses carry-less multiplication (128-bit / 512-bit) on this CPU.
CRC_CLMUL = bool(rmqha_have_clmul)
CRC_VCLMUL = bool(rmqha_have_vclmul_flag)


# ScanStop values as C constants (same numbers as the enum).
cdef enum:
    S_END = 0
    S_ZEROS = 1
    S_BLANK = 2
    S_TORN = 3
    S_BAD_MAGIC = 4
    S_BAD_SIZE = 5
    S_BAD_LENGTHS = 6
    S_BAD_CRC = 7
    S_BAD_OFFSET = 8
    S_ZERO_TAIL = 9


cdef inline int _get_buffer(object obj, Py_buffer* view, int flags) except -1:
    PyObject_GetBuffer(obj, view, flags)
    return 0


cdef int _get_batch_out(object buf, Py_buffer* out, Py_ssize_t pos, Py_ssize_t limit) except -1:
    """The writable buffer a batch is written into, holding [pos, limit) (released
    again when it does not)."""
    _get_buffer(buf, out, PyBUF_WRITABLE)
    if pos < 0 or limit > out.len or pos > limit:
        length = out.len
        PyBuffer_Release(out)
        raise StoreError(f"batch range {pos}..{limit} outside a buffer of {length}")
    return 0


cdef int _get_int_array(object obj, Py_buffer* view, Py_ssize_t n, Py_ssize_t itemsize,
                        str name) except -1:
    # A writable buffer of at least n integers of itemsize bytes (array('q'), array('i')).
    _get_buffer(obj, view, PyBUF_WRITABLE)
    if view.len < n * itemsize or view.itemsize != itemsize:
        PyBuffer_Release(view)
        raise StoreError(f"{name} must hold {n} int{itemsize * 8} values")
    return 0


def crc32(data, uint32_t value=0):
    """CRC-32 with zlib semantics (``zlib.crc32``)."""
    cdef Py_buffer view
    cdef uint32_t out
    _get_buffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = rmqha_crc32(value, <const unsigned char*>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return out


cdef uint32_t body_crc_c(const unsigned char* p, size_t n) noexcept nogil:
    """The masked body CRC for C callers (declared in records.pxd)."""
    return rmqha_crc32(0, p, n) & 0x7FFFFFFFu


def body_crc(body):
    """The record's body CRC: CRC-32 masked with 0x7FFFFFFF (RocketMQ's UtilAll.crc32)."""
    return crc32(body) & 0x7FFFFFFF


def message_size(Py_ssize_t body_len, Py_ssize_t topic_len, Py_ssize_t properties_len):
    return C_FIXED + body_len + topic_len + properties_len


cdef int _check_fields(bytes topic, bytes properties, bytes host_a, bytes host_b) except -1:
    if topic is None or not 0 < len(topic) <= 255:
        raise InvalidMessageError(
            f"topic must be 1..255 bytes, got {0 if topic is None else len(topic)}")
    if (<const unsigned char*><char*>topic)[len(topic) - 1] == 0:
        raise InvalidMessageError(_NUL_TOPIC)
    if properties is None or len(properties) > 32767:
        raise InvalidMessageError("properties must be bytes of at most 32767")
    if len(properties) and (<const unsigned char*><char*>properties)[len(properties) - 1] == 0:
        raise InvalidMessageError(_nul_property(properties))
    if host_a is None or host_b is None or len(host_a) != 8 or len(host_b) != 8:
        raise InvalidMessageError("hosts must be 8 bytes (IPv4 + int32 port)")
    return 0


cdef inline void _template(unsigned char* t, int32_t queue_id, int32_t flag, int32_t sys_flag,
                           int64_t born_ts, const char* born_host, int64_t store_ts,
                           const char* store_host, int32_t reconsume,
                           int64_t prepared) noexcept nogil:
    # Bytes 0..87 of a record; total size, CRC, queue/physical offsets and body length are
    # patched per record.
    memset(t, 0, 4)
    memset(t + 8, 0, 4)
    memset(t + 20, 0, 16)
    memset(t + 84, 0, 4)
    rmqha_put32(t + 4, C_MESSAGE_MAGIC)
    rmqha_put32(t + 12, <uint32_t>queue_id)
    rmqha_put32(t + 16, <uint32_t>flag)
    rmqha_put32(t + 36, <uint32_t>sys_flag)
    rmqha_put64(t + 40, <uint64_t>born_ts)
    memcpy(t + 48, born_host, 8)
    rmqha_put64(t + 56, <uint64_t>store_ts)
    memcpy(t + 64, store_host, 8)
    rmqha_put32(t + 72, <uint32_t>reconsume)
    rmqha_put64(t + 76, <uint64_t>prepared)


cdef inline void _emit(unsigned char* dst, const unsigned char* tmpl, Py_ssize_t size,
                       const unsigned char* body, Py_ssize_t blen, int64_t qoff, int64_t phys,
                       const unsigned char* tail, Py_ssize_t tail_len) noexcept nogil:
    memcpy(dst, tmpl, C_HEAD)
    rmqha_put32(dst, <uint32_t>size)
    rmqha_put32(dst + 8, rmqha_crc32_copy(0, dst + C_HEAD, body, <size_t>blen) & 0x7FFFFFFFu)
    rmqha_put64(dst + 20, <uint64_t>qoff)
    rmqha_put64(dst + 28, <uint64_t>phys)
    rmqha_put32(dst + 84, <uint32_t>blen)
    memcpy(dst + C_HEAD + blen, tail, <size_t>tail_len)


cdef bytes _tail(bytes topic, bytes properties):
    cdef Py_ssize_t plen = len(properties)
    return bytes((len(topic),)) + topic + bytes(((plen >> 8) & 0xFF, plen & 0xFF)) + properties


def write_message(object buf, Py_ssize_t pos, bytes topic, object body, bytes properties,
                  int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t physical_offset,
                  int32_t sys_flag, int64_t born_timestamp, bytes born_host,
                  int64_t store_timestamp, bytes store_host, int32_t reconsume_times,
                  int64_t prepared_transaction_offset):
    """Encode one record at ``buf[pos:]``; returns its size.  Nothing is written on error."""
    cdef Py_buffer out
    cdef Py_buffer src
    cdef unsigned char* d
    cdef Py_ssize_t size, tlen, plen, blen
    _check_fields(topic, properties, born_host, store_host)
    tlen = len(topic)
    plen = len(properties)
    _get_buffer(body, &src, PyBUF_SIMPLE)
    try:
        blen = src.len
        if blen > C_MAX_BODY:
            raise MessageTooLargeError(f"body of {blen} bytes is too large")
        size = C_FIXED + blen + tlen + plen
        _get_buffer(buf, &out, PyBUF_WRITABLE)
        try:
            if pos < 0 or pos + size > out.len:
                raise StoreError(
                    f"record of {size} bytes at {pos} does not fit a buffer of {out.len}")
            d = <unsigned char*>out.buf + pos
            # Header fields straight into place: one record needs no template.
            _template(d, queue_id, flag, sys_flag, born_timestamp, <const char*>born_host,
                      store_timestamp, <const char*>store_host, reconsume_times,
                      prepared_transaction_offset)
            rmqha_put32(d, <uint32_t>size)
            rmqha_put32(d + 8, rmqha_crc32_copy(0, d + C_HEAD, <const unsigned char*>src.buf,
                                                <size_t>blen) & 0x7FFFFFFFu)
            rmqha_put64(d + 20, <uint64_t>queue_offset)
            rmqha_put64(d + 28, <uint64_t>physical_offset)
            rmqha_put32(d + 84, <uint32_t>blen)
            d += C_HEAD + blen
            d[0] = <unsigned char>tlen
            memcpy(d + 1, <const char*>topic, <size_t>tlen)
            d += 1 + tlen
            d[0] = <unsigned char>(plen >> 8)
            d[1] = <unsigned char>(plen & 0xFF)
            memcpy(d + 2, <const char*>properties, <size_t>plen)
        finally:
            PyBuffer_Release(&out)
    finally:
        PyBuffer_Release(&src)
    return size


def write_batch(object buf, Py_ssize_t pos, Py_ssize_t limit, bytes topic, object bodies,
                Py_ssize_t start, bytes properties, int32_t queue_id, int32_t flag,
                int64_t queue_offset, int64_t base_offset, int32_t sys_flag,
                int64_t born_timestamp, bytes born_host, int64_t store_timestamp,
                bytes store_host, int32_t reconsume_times, int64_t prepared_transaction_offset,
                object offsets_out=None, Py_ssize_t max_record=0x7FFFFFFF):
    """Encode ``bodies[start:]`` from ``pos`` while each record ends at or before ``limit``.

    Record i gets queue offset ``queue_offset + i`` (i counted from ``start``) and physical
    offset ``base_offset + its position``; ``offsets_out[start + i]`` (a writable int64
    buffer such as ``array('q')``) receives it when given.  Returns ``(records written, end
    position)``.  Every body is checked first (type, and record size <= ``max_record``), so a
    bad one raises before anything is written.
    """
    cdef Py_buffer out
    cdef Py_buffer offs
    cdef Py_buffer src
    cdef unsigned char tmpl[C_HEAD]
    cdef unsigned char* dst
    cdef const unsigned char* tail_p
    cdef const unsigned char* body_p
    cdef int64_t* off_p = NULL
    cdef PyObject* item
    cdef Py_ssize_t n, i, blen, size, extra, tail_len, count = 0
    cdef bytes tail
    cdef list items
    _check_fields(topic, properties, born_host, store_host)
    extra = C_FIXED + len(topic) + len(properties)
    items = bodies if type(bodies) is list else list(bodies)
    n = len(items)
    if start < 0 or start > n:
        raise StoreError(f"start {start} outside a batch of {n}")
    # Pre-pass: types and sizes, so a bad body raises before a byte is written.
    for i in range(start, n):
        item = _list_item(items, i)
        if _bytes_check(item):
            blen = _bytes_size(item)
        elif isinstance(<object>item, (bytearray, memoryview)):
            blen = len(<object>item)
        else:
            raise InvalidMessageError(f"body {i} is {type(<object>item).__name__}, not bytes-like")
        if blen > C_MAX_BODY or extra + blen > max_record:
            raise MessageTooLargeError(
                f"message {i}: a record of {extra + blen} bytes exceeds the limit of "
                f"{min(max_record, 0x7FFFFFFF)}")
    tail = _tail(topic, properties)
    tail_p = <const unsigned char*><char*>tail
    tail_len = len(tail)
    extra = C_HEAD + tail_len
    _template(tmpl, queue_id, flag, sys_flag, born_timestamp, <const char*>born_host,
              store_timestamp, <const char*>store_host, reconsume_times,
              prepared_transaction_offset)
    _get_batch_out(buf, &out, pos, limit)
    try:
        if offsets_out is not None:
            _get_int_array(offsets_out, &offs, n, 8, "offsets_out")
            off_p = <int64_t*>offs.buf
        try:
            dst = <unsigned char*>out.buf
            for i in range(start, n):
                item = _list_item(items, i)
                if _bytes_check(item):
                    blen = _bytes_size(item)
                    size = extra + blen
                    if pos + size > limit:
                        break
                    _emit(dst + pos, tmpl, size, <const unsigned char*>_bytes_data(item), blen,
                          queue_offset + count, base_offset + pos, tail_p, tail_len)
                else:
                    _get_buffer(<object>item, &src, PyBUF_SIMPLE)
                    blen = src.len
                    size = extra + blen
                    if pos + size > limit:
                        PyBuffer_Release(&src)
                        break
                    _emit(dst + pos, tmpl, size, <const unsigned char*>src.buf, blen,
                          queue_offset + count, base_offset + pos, tail_p, tail_len)
                    PyBuffer_Release(&src)
                if off_p != NULL:
                    off_p[i] = base_offset + pos
                pos += size
                count += 1
        finally:
            if off_p != NULL:
                PyBuffer_Release(&offs)
    finally:
        PyBuffer_Release(&out)
    return count, pos


# --- SEND_BATCH bodies (layout and rules in records_py.py) --------------------------------

cdef enum:
    C_MAX_PLAIN_KEYS = 64

BATCH_ENTRY_FIXED = 22
MAX_PLAIN_KEYS = C_MAX_PLAIN_KEYS


cdef bint _reserved(const unsigned char* k, Py_ssize_t klen, tuple keys, tuple prefixes):
    cdef object item
    cdef Py_ssize_t ilen
    for item in keys:
        ilen = len(<bytes>item)
        if ilen == klen and memcmp(<const char*><bytes>item, k, <size_t>klen) == 0:
            return True
    for item in prefixes:
        ilen = len(<bytes>item)
        if ilen <= klen and memcmp(<const char*><bytes>item, k, <size_t>ilen) == 0:
            return True
    return False


cdef bint _plain_properties(const unsigned char* p, Py_ssize_t n, tuple keys,
                            tuple prefixes) except -1:
    cdef Py_ssize_t i, start = 0, sep = -1, j, nkeys = 0
    cdef Py_ssize_t kstart[C_MAX_PLAIN_KEYS]
    cdef Py_ssize_t klen[C_MAX_PLAIN_KEYS]
    cdef bint ascii = True
    if p[n - 1] != 2:
        return False
    for i in range(n):
        if p[i] & 0x80:
            ascii = False
            break
    if not ascii:
        try:
            PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
        except UnicodeDecodeError:
            return False
    for i in range(n):
        if p[i] == 1:
            if sep >= 0:
                return False  # a second separator: the value would keep it
            sep = i
        elif p[i] == 2:
            if sep <= start or sep == i - 1 or nkeys == C_MAX_PLAIN_KEYS:
                return False  # no separator, an empty key or value, or too many keys
            if _reserved(p + start, sep - start, keys, prefixes):
                return False
            for j in range(nkeys):
                if klen[j] == sep - start and memcmp(p + kstart[j], p + start,
                                                     <size_t>(sep - start)) == 0:
                    return False
            kstart[nkeys] = start
            klen[nkeys] = sep - start
            nkeys += 1
            start = i + 1
            sep = -1
    return True


def properties_plain(bytes raw, tuple reserved_keys=(), tuple reserved_prefixes=()):
    """Whether encoded properties are canonical and hold none of the reserved keys (see
    ``records_py.properties_plain``)."""
    if not raw:
        return True
    return _plain_properties(<const unsigned char*><char*>raw, len(raw), reserved_keys,
                             reserved_prefixes)


def batch_plain(object batch, Py_ssize_t max_items, tuple reserved_keys=(),
                tuple reserved_prefixes=()):
    """How many entries a batch body holds, when all of them can be stored as they came;
    -1 when not (see ``records_py.batch_plain``)."""
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef Py_ssize_t n, pos = 0, count = 0, total, blen, plen
    _get_buffer(batch, &view, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>view.buf
        n = view.len
        while pos < n:
            if n - pos < 22:
                return -1
            total = <int32_t>rmqha_get32(b + pos)
            blen = <int32_t>rmqha_get32(b + pos + 16)
            if total < 22 or total > n - pos or blen < 0 or 22 + blen > total:
                return -1
            plen = <int16_t>(<uint16_t>b[pos + 20 + blen] << 8 | b[pos + 21 + blen])
            if plen < 0 or 22 + blen + plen != total:
                return -1
            count += 1
            if count > max_items:
                return -1
            if plen and not _plain_properties(b + pos + 22 + blen, plen, reserved_keys,
                                              reserved_prefixes):
                return -1
            pos += total
        return count
    finally:
        PyBuffer_Release(&view)


def write_batch_entries(object buf, Py_ssize_t pos, Py_ssize_t limit, bytes topic,
                        object batch, Py_ssize_t src, int32_t queue_id, int64_t queue_offset,
                        int64_t base_offset, int32_t sys_flag, int64_t born_timestamp,
                        bytes born_host, int64_t store_timestamp, bytes store_host,
                        object offsets_out, object sizes_out, Py_ssize_t index,
                        Py_ssize_t max_record=0x7FFFFFFF):
    """Encode the entries of a batch body from byte ``src`` as records from ``pos`` while
    each ends at or before ``limit``; returns ``(records written, end position, next
    src)`` (see ``records_py.write_batch_entries``)."""
    cdef Py_buffer out, inp, offs, szs
    cdef unsigned char tmpl[C_HEAD]
    cdef unsigned char* dst
    cdef unsigned char* d
    cdef const unsigned char* b
    cdef int64_t* off_p = NULL
    cdef int32_t* size_p = NULL
    cdef Py_ssize_t n, p, k, total, blen, plen, size, tlen, count = 0
    cdef int have_offs = 0, have_sizes = 0
    _check_fields(topic, b"", born_host, store_host)
    tlen = len(topic)
    _template(tmpl, queue_id, 0, sys_flag, born_timestamp, <const char*>born_host,
              store_timestamp, <const char*>store_host, 0, 0)
    _get_buffer(batch, &inp, PyBUF_SIMPLE)
    try:
        b = <const unsigned char*>inp.buf
        n = inp.len
        if src < 0 or src > n:
            raise StoreError(f"batch position {src} outside a body of {n} bytes")
        # Pre-pass: sizes, so a bad entry raises before a byte is written.
        p = src
        k = index
        while p < n:
            if n - p < 22:
                raise InvalidMessageError(f"batch entry at {p} shorter than its header")
            total = <int32_t>rmqha_get32(b + p)
            blen = <int32_t>rmqha_get32(b + p + 16)
            plen = -1
            if 0 <= blen <= total - 22 and total <= n - p:
                plen = <int16_t>(<uint16_t>b[p + 20 + blen] << 8 | b[p + 21 + blen])
            if total < 22 or total > n - p or plen < 0 or 22 + blen + plen != total:
                raise InvalidMessageError(f"batch entry at {p}: sizes do not add up")
            if plen and b[p + total - 1] == 0:
                raise InvalidMessageError(f"batch entry at {p}: " + _nul_property(
                    PyBytes_FromStringAndSize(<const char*>b + p + total - plen, plen)))
            size = C_FIXED + blen + tlen + plen
            if size > max_record:
                raise MessageTooLargeError(
                    f"message {k}: a record of {size} bytes exceeds the limit of "
                    f"{min(max_record, 0x7FFFFFFF)}")
            p += total
            k += 1
        _get_batch_out(buf, &out, pos, limit)
        try:
            if offsets_out is not None:
                _get_int_array(offsets_out, &offs, k, 8, "offsets_out")
                have_offs = 1
                off_p = <int64_t*>offs.buf
            if sizes_out is not None:
                _get_int_array(sizes_out, &szs, k, 4, "sizes_out")
                have_sizes = 1
                size_p = <int32_t*>szs.buf
            dst = <unsigned char*>out.buf
            while src < n:
                total = <int32_t>rmqha_get32(b + src)
                blen = <int32_t>rmqha_get32(b + src + 16)
                plen = total - 22 - blen
                size = C_FIXED + blen + tlen + plen
                if pos + size > limit:
                    break
                d = dst + pos
                memcpy(d, tmpl, C_HEAD)
                rmqha_put32(d, <uint32_t>size)
                rmqha_put32(d + 8, rmqha_crc32_copy(0, d + C_HEAD, b + src + 20,
                                                    <size_t>blen) & 0x7FFFFFFFu)
                memcpy(d + 16, b + src + 12, 4)  # the entry's flag
                rmqha_put64(d + 20, <uint64_t>(queue_offset + count))
                rmqha_put64(d + 28, <uint64_t>(base_offset + pos))
                rmqha_put32(d + 84, <uint32_t>blen)
                d += C_HEAD + blen
                d[0] = <unsigned char>tlen
                memcpy(d + 1, <const char*>topic, <size_t>tlen)
                # The entry's int16 length and properties are the record's uint16 and pairs.
                memcpy(d + 1 + tlen, b + src + 20 + blen, <size_t>(2 + plen))
                if off_p != NULL:
                    off_p[index + count] = base_offset + pos
                if size_p != NULL:
                    size_p[index + count] = <int32_t>size
                pos += size
                src += total
                count += 1
        finally:
            if have_offs:
                PyBuffer_Release(&offs)
            if have_sizes:
                PyBuffer_Release(&szs)
            PyBuffer_Release(&out)
    finally:
        PyBuffer_Release(&inp)
    return count, pos, src


# --- runs of plain sends (send_frames' SendFrame tuples) -----------------------------------

cdef extern from "Python.h":
    PyObject* _tuple_item "PyTuple_GET_ITEM"(PyObject*, Py_ssize_t)
    bint _tuple_check "PyTuple_CheckExact"(PyObject*)
    Py_ssize_t _tuple_size "PyTuple_GET_SIZE"(PyObject*)
    bint _long_check "PyLong_CheckExact"(PyObject*)
    long long _long_value "PyLong_AsLongLongAndOverflow"(PyObject*, int*)
    PyObject* _dict_get "PyDict_GetItem"(object, PyObject*)

cdef enum:
    RUN_DONE = 0
    RUN_FULL = 1
    RUN_SINGLE = 2
    C_RUN_KEYS = 32
    C_V6_HOSTS = 0x30

RUN_STOP_DONE = RUN_DONE
RUN_STOP_FULL = RUN_FULL
RUN_STOP_SINGLE = RUN_SINGLE
RUN_MAX_KEYS = C_RUN_KEYS


cdef inline bint _int_in(PyObject* o, int64_t lo, int64_t hi, int64_t* out) noexcept:
    # An exact int within [lo, hi] (never raises: an exact int cannot fail the conversion).
    cdef int overflow = 0
    cdef long long v
    if not _long_check(o):
        return False
    v = _long_value(o, &overflow)
    if overflow or v < lo or v > hi:
        return False
    out[0] = v
    return True


def write_plain_run(object buf, Py_ssize_t pos, Py_ssize_t limit, int64_t base_offset,
                    list sends, Py_ssize_t start, Py_ssize_t stop, object queue_ids,
                    dict topics, dict queue_offsets, int64_t born_default, bytes born_host,
                    int64_t store_timestamp, bytes store_host, object offsets_out,
                    object sizes_out, object queue_offsets_out,
                    Py_ssize_t max_record=0x7FFFFFFF):
    """Encode ``sends[start:stop]`` as records from ``pos`` while each ends at or before
    ``limit``; returns ``(records written, end position, why it stopped)`` (see
    ``records_py.write_plain_run``)."""
    cdef Py_buffer out, qids, offs, szs, qos
    cdef int have_out = 0, have_qids = 0, have_offs = 0, have_szs = 0
    cdef unsigned char* d
    cdef PyObject* t
    cdef PyObject* tb
    cdef PyObject* props
    cdef PyObject* body
    cdef PyObject* found
    cdef int32_t* qid_p
    cdef int64_t* off_p
    cdef int32_t* size_p
    cdef int64_t* qo_p
    cdef PyObject* key_tb[C_RUN_KEYS]
    cdef int32_t key_qid[C_RUN_KEYS]
    cdef int64_t key_next[C_RUN_KEYS]
    cdef list keys = []
    cdef Py_ssize_t i, k, nkeys = 0, tlen, plen, blen, size, count = 0
    cdef int64_t sys_flag, born, flag, reconsume, qoff
    cdef int32_t qid
    cdef int why = RUN_DONE
    cdef object key
    if stop > len(sends) or start < 0 or start > stop:
        raise StoreError(f"run {start}..{stop} outside {len(sends)} sends")
    _check_fields(b"-", b"", born_host, store_host)
    try:
        _get_batch_out(buf, &out, pos, limit)
        have_out = 1
        _get_int_array(queue_ids, &qids, stop, 4, "queue_ids")
        have_qids = 1
        _get_int_array(offsets_out, &offs, stop, 8, "offsets_out")
        have_offs = 1
        _get_int_array(sizes_out, &szs, stop, 4, "sizes_out")
        have_szs = 1
        _get_int_array(queue_offsets_out, &qos, stop, 8, "queue_offsets_out")
        qid_p = <int32_t*>qids.buf
        off_p = <int64_t*>offs.buf
        size_p = <int32_t*>szs.buf
        qo_p = <int64_t*>qos.buf
        try:
            for i in range(start, stop):
                # Whatever a check here does not pass goes one by one (append_plain), which
                # refuses it by name or caches what it lacked (the topic's bytes).
                why = RUN_SINGLE
                t = _list_item(sends, i)
                if not _tuple_check(t) or _tuple_size(t) < 11:
                    break
                tb = _dict_get(topics, _tuple_item(t, 3))
                if tb == NULL or not _bytes_check(tb):
                    break
                tlen = _bytes_size(tb)
                qid = qid_p[i]
                props = _tuple_item(t, 8)
                body = _tuple_item(t, 10)
                if (qid < 0 or tlen == 0 or tlen > 255
                        or (<const unsigned char*>_bytes_data(tb))[tlen - 1] == 0
                        or not _bytes_check(props)
                        or not _bytes_check(body)
                        or not _int_in(_tuple_item(t, 5), 0, 0x7FFFFFFF, &sys_flag)
                        or sys_flag & C_V6_HOSTS
                        or not _int_in(_tuple_item(t, 6), 0, 0x7FFFFFFFFFFFFFFF, &born)
                        or not _int_in(_tuple_item(t, 7), -0x80000000, 0x7FFFFFFF, &flag)
                        or not _int_in(_tuple_item(t, 9), 0, 0x7FFFFFFF, &reconsume)):
                    break
                plen = _bytes_size(props)
                blen = _bytes_size(body)
                if plen > 32767 or blen > C_MAX_BODY:
                    break
                size = C_FIXED + blen + tlen + plen
                if size > max_record:
                    break
                if plen and not _plain_properties(<const unsigned char*>_bytes_data(props),
                                                  plen, (), ()):
                    break
                if pos + size > limit:
                    why = RUN_FULL
                    break
                k = 0
                while k < nkeys and not (key_tb[k] == tb and key_qid[k] == qid):
                    k += 1
                if k == nkeys:
                    if nkeys == C_RUN_KEYS:
                        break
                    key = (<object>tb, qid)
                    found = _dict_get(queue_offsets, <PyObject*>key)
                    if found == NULL:
                        qoff = 0
                    elif not _int_in(found, 0, 0x7FFFFFFFFFFFFFFF, &qoff):
                        break
                    keys.append(key)
                    key_tb[k] = tb
                    key_qid[k] = qid
                    key_next[k] = qoff
                    nkeys += 1
                qoff = key_next[k]
                key_next[k] = qoff + 1
                d = <unsigned char*>out.buf + pos
                _template(d, qid, <int32_t>flag, <int32_t>sys_flag,
                          born if born else born_default, <const char*>born_host,
                          store_timestamp, <const char*>store_host, <int32_t>reconsume, 0)
                rmqha_put32(d, <uint32_t>size)
                rmqha_put32(d + 8, rmqha_crc32_copy(0, d + C_HEAD,
                                                    <const unsigned char*>_bytes_data(body),
                                                    <size_t>blen) & 0x7FFFFFFFu)
                rmqha_put64(d + 20, <uint64_t>qoff)
                rmqha_put64(d + 28, <uint64_t>(base_offset + pos))
                rmqha_put32(d + 84, <uint32_t>blen)
                d += C_HEAD + blen
                d[0] = <unsigned char>tlen
                memcpy(d + 1, _bytes_data(tb), <size_t>tlen)
                d += 1 + tlen
                d[0] = <unsigned char>(plen >> 8)
                d[1] = <unsigned char>(plen & 0xFF)
                memcpy(d + 2, _bytes_data(props), <size_t>plen)
                off_p[i] = base_offset + pos
                size_p[i] = <int32_t>size
                qo_p[i] = qoff
                pos += size
                count += 1
                why = RUN_DONE
        finally:
            PyBuffer_Release(&qos)
            # The table moves with what was written, whatever stopped the run.
            for k in range(nkeys):
                queue_offsets[keys[k]] = key_next[k]
    finally:
        if have_szs:
            PyBuffer_Release(&szs)
        if have_offs:
            PyBuffer_Release(&offs)
        if have_qids:
            PyBuffer_Release(&qids)
        if have_out:
            PyBuffer_Release(&out)
    return count, pos, why


def write_blank(object buf, Py_ssize_t pos, Py_ssize_t size):
    """Write the blank record header (``size`` = bytes left in the segment, >= 8)."""
    cdef Py_buffer out
    if size < C_MIN_BLANK:
        raise StoreError(f"a blank record needs at least 8 bytes, got {size}")
    _get_buffer(buf, &out, PyBUF_WRITABLE)
    try:
        if pos < 0 or pos + size > out.len:
            raise StoreError(f"record of {size} bytes at {pos} does not fit a buffer of {out.len}")
        rmqha_put32(<unsigned char*>out.buf + pos, <uint32_t>size)
        rmqha_put32(<unsigned char*>out.buf + pos + 4, C_BLANK_MAGIC)
    finally:
        PyBuffer_Release(&out)


cdef int _check_record(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end,
                       Py_ssize_t seg_end, int64_t base_offset, bint verify,
                       Py_ssize_t* size_out) noexcept nogil:
    # Returns -1 for a valid message (size in size_out) or a stop code.
    cdef Py_ssize_t i
    cdef uint32_t total, magic
    cdef int64_t blen, tlen, plen
    if end - pos < C_MIN_BLANK:
        for i in range(pos, end):
            if b[i] != 0:
                return S_TORN
        return S_ZEROS
    total = rmqha_get32(b + pos)
    magic = rmqha_get32(b + pos + 4)
    if total == 0 and magic == 0:
        return S_ZEROS
    if magic == C_BLANK_MAGIC:
        if <int64_t>total != seg_end - pos:
            return S_BAD_SIZE
        if <int64_t>total > end - pos:
            return S_TORN
        size_out[0] = total
        return S_BLANK
    if magic != C_MESSAGE_MAGIC:
        return S_BAD_MAGIC
    if total < C_FIXED or <int64_t>total > seg_end - pos:
        return S_BAD_SIZE
    if <int64_t>total > end - pos:
        return S_TORN
    blen = <int32_t>rmqha_get32(b + pos + 84)
    if blen < 0 or blen > <int64_t>total - C_FIXED:
        return S_BAD_LENGTHS
    tlen = b[pos + C_HEAD + blen]
    if tlen == 0 or C_FIXED + blen + tlen > <int64_t>total:
        return S_BAD_LENGTHS
    plen = <int64_t>b[pos + 89 + blen + tlen] << 8 | b[pos + 90 + blen + tlen]
    if C_FIXED + blen + tlen + plen != <int64_t>total:
        return S_BAD_LENGTHS
    if <int64_t>rmqha_get64(b + pos + 28) != base_offset + pos:
        return S_BAD_OFFSET
    if verify:
        if (rmqha_crc32(0, b + pos + C_HEAD, <size_t>blen) & 0x7FFFFFFFu) != rmqha_get32(b + pos + 8):
            return S_BAD_CRC
        # The properties' last byte, or without them the topic's (before the length's two).
        if b[pos + total - (1 if plen else 3)] == 0:
            return S_ZERO_TAIL
    size_out[0] = total
    return -1


def scan(object buf, Py_ssize_t pos, Py_ssize_t end, int64_t base_offset, int64_t verify_from,
         dict table=None, bint lower=False, Py_ssize_t seg_end=-1):
    """Walk and validate records in ``buf[pos:end]``; returns ``(stop position, ScanStop, count)``.

    ``buf`` is a whole segment: a blank record must reach ``len(buf)`` exactly, and ``end``
    is where the written data ends (a record or blank running past it is TORN).  Records that
    end past global offset ``verify_from`` are checked whole: body CRC (BAD_CRC) and last
    written byte (ZERO_TAIL, see ``records_py``'s docstring).  With ``table``, every message
    updates ``table[(topic bytes, queue id)]`` to its queue offset + 1 or, with ``lower``,
    to the smallest queue offset seen (used to forget records being truncated).

    ``seg_end`` (>= ``end``) says where the segment ends, counted from ``buf[0]``, when
    ``buf`` is only a piece of it (a replicated block; ``base_offset`` is then the global
    offset of ``buf[0]``); a blank record must reach it and the stop position of a blank
    is ``seg_end``.
    """
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef Py_ssize_t size = 0, count = 0, blen, tlen, last_t = -1, last_tlen = 0
    cdef int stop = S_END
    cdef bint verify
    cdef int32_t qid, last_qid = 0
    cdef int64_t qoff, last_qoff = 0
    cdef object key = None
    _get_buffer(buf, &view, PyBUF_SIMPLE)
    try:
        if seg_end < 0:
            seg_end = view.len
        if pos < 0 or end > view.len or pos > end or seg_end < end:
            raise StoreError(f"scan range {pos}..{end} outside a buffer of {view.len} "
                             f"(segment end {seg_end})")
        b = <const unsigned char*>view.buf
        # Every field read stays below ``end`` (<= view.len): _check_record returns TORN
        # for a record or blank running past it, whatever ``seg_end`` is.
        while pos < end:
            # A record that starts below verify_from but runs past it was not all
            # flushed (a slave flushes mid-record): its CRC is checked too.
            verify = base_offset + pos >= verify_from or (
                end - pos >= 4 and base_offset + pos + <int32_t>rmqha_get32(b + pos) > verify_from)
            stop = _check_record(b, pos, end, seg_end, base_offset, verify, &size)
            if stop >= 0:
                if stop == S_BLANK:
                    pos = seg_end
                break
            stop = S_END
            if table is not None:
                blen = <int32_t>rmqha_get32(b + pos + 84)
                tlen = b[pos + C_HEAD + blen]
                qid = <int32_t>rmqha_get32(b + pos + 12)
                qoff = <int64_t>rmqha_get64(b + pos + 20)
                # Runs of one (topic, queue) are the norm: only build a key on a change.
                if (key is None or qid != last_qid or tlen != last_tlen or
                        memcmp(b + last_t, b + pos + 89 + blen, tlen) != 0):
                    if key is not None:
                        _table_put(table, key, last_qoff, lower)
                    key = (PyBytes_FromStringAndSize(<const char*>b + pos + 89 + blen, tlen), qid)
                    last_qid = qid
                    last_tlen = tlen
                    last_qoff = qoff
                elif lower:
                    if qoff < last_qoff:
                        last_qoff = qoff
                else:
                    last_qoff = qoff
                last_t = pos + 89 + blen
            pos += size
            count += 1
        if key is not None:
            _table_put(table, key, last_qoff, lower)
    finally:
        PyBuffer_Release(&view)
    return pos, stop, count


cdef inline int _table_put(dict table, object key, int64_t qoff, bint lower) except -1:
    cdef object old
    if lower:
        old = table.get(key)
        if old is None or qoff < old:
            table[key] = qoff
    else:
        table[key] = qoff + 1
    return 0


def decode(object buf, Py_ssize_t pos, Py_ssize_t limit, bint verify_crc=True):
    """Decode the message at ``pos`` (ending at or before ``limit``) into a 17-tuple:

    (total_size, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
    born_timestamp, born_host(8 bytes), store_timestamp, store_host(8 bytes),
    reconsume_times, prepared_transaction_offset, body, topic, properties) -- bytes copied.
    CorruptRecordError if it is not a valid message (with ``verify_crc``, also a body CRC
    or last byte that fails :func:`scan`'s check).
    """
    cdef Py_buffer view
    cdef const unsigned char* b
    cdef const unsigned char* r
    cdef Py_ssize_t size = 0, blen, tlen, plen
    cdef int stop
    cdef int64_t phys
    _get_buffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or limit > view.len or pos > limit:
            raise StoreError(f"decode range {pos}..{limit} outside a buffer of {view.len}")
        b = <const unsigned char*>view.buf
        if limit - pos < C_MIN_BLANK:
            raise CorruptRecordError(f"no record header at {pos}: only {limit - pos} bytes")
        if rmqha_get32(b + pos + 4) == C_BLANK_MAGIC:
            raise CorruptRecordError(
                f"record at {pos} is a blank (segment padding), not a message")
        phys = <int64_t>rmqha_get64(b + pos + 28) if limit - pos >= 36 else 0
        stop = _check_record(b, pos, limit, limit, phys - pos, verify_crc, &size)
        if stop >= 0:
            raise CorruptRecordError(f"invalid record at {pos}: {ScanStop(stop).name}")
        r = b + pos
        blen = <int32_t>rmqha_get32(r + 84)
        tlen = r[C_HEAD + blen]
        plen = <Py_ssize_t>r[89 + blen + tlen] << 8 | r[90 + blen + tlen]
        return (<int32_t>rmqha_get32(r), rmqha_get32(r + 4), rmqha_get32(r + 8),
                <int32_t>rmqha_get32(r + 12), <int32_t>rmqha_get32(r + 16),
                <int64_t>rmqha_get64(r + 20), <int64_t>rmqha_get64(r + 28),
                <int32_t>rmqha_get32(r + 36), <int64_t>rmqha_get64(r + 40),
                PyBytes_FromStringAndSize(<const char*>r + 48, 8),
                <int64_t>rmqha_get64(r + 56),
                PyBytes_FromStringAndSize(<const char*>r + 64, 8),
                <int32_t>rmqha_get32(r + 72), <int64_t>rmqha_get64(r + 76),
                PyBytes_FromStringAndSize(<const char*>r + C_HEAD, blen),
                PyBytes_FromStringAndSize(<const char*>r + 89 + blen, tlen),
                PyBytes_FromStringAndSize(<const char*>r + 91 + blen + tlen, plen))
    finally:
        PyBuffer_Release(&view)


def prefault(object buf, Py_ssize_t start=0, Py_ssize_t end=-1):
    """Fault in every page of a writable buffer from ``start`` to ``end`` (default: its
    end), without changing a byte (MADV_POPULATE_WRITE, or an atomic no-op per page on
    older kernels; GIL released)."""
    cdef Py_buffer view
    _get_buffer(buf, &view, PyBUF_WRITABLE)
    try:
        if end < 0:
            end = view.len
        if start < 0 or start > end or end > view.len:
            raise StoreError(f"prefault range {start}..{end} outside a buffer of {view.len}")
        with nogil:
            rmqha_prefault(<unsigned char*>view.buf + start, <size_t>(end - start))
    finally:
        PyBuffer_Release(&view)


def resident(object buf, Py_ssize_t start, Py_ssize_t end):
    """Whether the pages of ``buf[start:end]`` are in memory, judged by its first and last
    page (mincore; True where the kernel cannot tell).  Warm-up faults pages in front to
    back, so both ends resident means the range is."""
    cdef Py_buffer view
    cdef int res
    _get_buffer(buf, &view, PyBUF_SIMPLE)
    try:
        if start < 0 or start >= end or end > view.len:
            raise StoreError(f"resident range {start}..{end} outside a buffer of {view.len}")
        with nogil:
            res = rmqha_resident(<unsigned char*>view.buf + start, <size_t>(end - start))
    finally:
        PyBuffer_Release(&view)
    return res != 0
