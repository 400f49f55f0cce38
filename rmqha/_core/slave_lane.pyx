# cython: language_level=3
"""The HA slave's compiled receive lane: receive, check, append, ack, with no GIL held.

One :class:`SlaveLane` runs on its own native thread (started by ``rmqha.ha.slave_lane``)
and, from the first byte of a block to its ack frame, never enters the interpreter: it
reads the plaintext HA socket into the session's receive buffer, takes the *plain* frames
(the ones ``frames.scan_transfer_run`` takes, plus heartbeats that say nothing new), checks
their tags when the link is authenticated (HMAC-SHA256 and AES-256-GCM GMAC through
OpenSSL's libcrypto, byte for byte what ``rmqha.ha.frame_mac`` computes), writes each block
into the active segment (a copy into the mapping where the warm-up faulted it in, else
one ``pwrite``), validates its records with the records codec's own C check (the code
``records.scan`` runs), and sends the TRANSFER_ACK frames ``pack_transfer_ack`` would.

Anything else stops the loop at a clean boundary, the frame left unread at the front of
the buffer, and the Python path takes over with the same checks and errors as ever: an
unusual frame (another type, an epoch change, a jump, a confirm offset it cannot learn), a
block beyond the room the log granted (the segment's reserved blocks, the segment end), a
frame larger than the buffer, a stop request, and every failure (a bad record, zeroed; a bad
tag; a silent master; a closed socket; an I/O error), which the Python side raises as its
own path would.  Python hears of progress only through an eventfd, at most one wake-up
pending at a time (under load one wake-up covers many blocks), and reads the counters.

Memory: the receive buffer (a bytearray) and the segment's mapping are held through the
buffer protocol while the lane is armed (neither can be resized or closed under it); the
socket stays the Python link's (the lane never closes it); the two eventfds are the
lane's own.  Figures: see ``docs/benchmarks.md`` (CPU per message at 256 in flight).
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset

from rmqha._core.records cimport _check_record
from rmqha._core.records_py import ScanStop

cdef extern from *:
    """
    #include <errno.h>
    #include <poll.h>
    #include <stdint.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/eventfd.h>
    #include <sys/socket.h>
    #include <time.h>
    #include <unistd.h>
    #include <openssl/crypto.h>
    #include <openssl/evp.h>

    enum { LANE_RUNNING = 0, LANE_STOPPED = 1, LANE_OTHER = 2, LANE_ROOM = 3, LANE_BIG = 4,
           LANE_TIMEOUT = 5, LANE_CLOSED = 6, LANE_OSERROR = 7, LANE_CORRUPT = 8, LANE_AUTH = 9,
           LANE_SEND = 10 };
    #define LANE_HDR 48
    #define LANE_TAG 16
    #define LANE_CHUNK 1024               /* frames checked before any of them is applied */
    #define LANE_ACK_EVERY (8 << 20)      /* receive.py's _ACK_EVERY_BYTES */

    typedef int (*lane_check_fn)(const unsigned char *, Py_ssize_t, Py_ssize_t, Py_ssize_t, int64_t, int,
                                 Py_ssize_t *);

    typedef struct {
        EVP_MD_CTX *ipad, *opad, *tmp;
        unsigned char dir[32];
        int dir_len;
        uint64_t seq;
    } lane_tags;

    typedef struct { Py_ssize_t pos; int64_t size, block, confirm; } lane_span;

    typedef struct {
        int fd, stop_fd, event_fd;
        unsigned char *buf; Py_ssize_t cap, start, end;
        unsigned char *seg; int seg_fd; int64_t seg_base, sb;
        int64_t max_frame, epoch, epoch_start, heartbeat_ns, housekeeping_ns;
        int tag;
        lane_check_fn check;
        int s_end, s_blank, s_torn, s_zeros;
        /* shared with the Python side: __atomic loads and stores */
        int64_t limit, warm, log_end, whole, learnt, acked, blocks, heartbeats, bytes_in, bytes_out, acks;
        int64_t last_read_ns, last_write_ns, signalled_end, signalled_learnt;
        int stopping, pending, suspend;
        /* why it stopped */
        int why, err, bad_stop; int64_t bad_block, bad_at;
        unsigned char unsent[LANE_HDR]; int unsent_len;
        /* the link's MAC */
        int mac; lane_tags in, out; EVP_CIPHER_CTX *gcm; uint64_t count_in;
        lane_span spans[LANE_CHUNK];
    } rmqha_lane;

    #define LD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
    #define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

    static inline int64_t lane_rd64(const unsigned char *p) { uint64_t u; memcpy(&u, p, 8); return (int64_t) __builtin_bswap64(u); }
    static inline int32_t lane_rd32(const unsigned char *p) { uint32_t u; memcpy(&u, p, 4); return (int32_t) __builtin_bswap32(u); }
    static inline void lane_wr64(unsigned char *p, int64_t v) { uint64_t u = __builtin_bswap64((uint64_t) v); memcpy(p, &u, 8); }
    static inline void lane_wr32(unsigned char *p, int32_t v) { uint32_t u = __builtin_bswap32((uint32_t) v); memcpy(p, &u, 4); }

    static int64_t lane_clock(clockid_t id) {
        struct timespec ts; clock_gettime(id, &ts);
        return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }

    /* --- the MAC: rmqha.security.link_auth's tags, rmqha.ha.frame_mac's GMAC ------------- */

    static void lane_tags_free(lane_tags *t) {
        if (t->ipad) EVP_MD_CTX_free(t->ipad);
        if (t->opad) EVP_MD_CTX_free(t->opad);
        if (t->tmp) EVP_MD_CTX_free(t->tmp);
        t->ipad = t->opad = t->tmp = NULL;
    }

    /* HMAC-SHA256's two padded key blocks, hashed once (as _FrameTags does). */
    static int lane_tags_init(lane_tags *t, const unsigned char *key, size_t klen, const unsigned char *dir,
                              size_t dlen, uint64_t seq) {
        unsigned char k[64], pad[64];
        unsigned int n;
        size_t i;
        lane_tags_free(t);
        if (dlen > sizeof(t->dir)) return 0;
        memset(k, 0, sizeof(k));
        if (klen > 64) { if (!EVP_Digest(key, klen, k, &n, EVP_sha256(), NULL)) return 0; }
        else memcpy(k, key, klen);
        t->ipad = EVP_MD_CTX_new(); t->opad = EVP_MD_CTX_new(); t->tmp = EVP_MD_CTX_new();
        if (!t->ipad || !t->opad || !t->tmp) return 0;
        for (i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
        if (!EVP_DigestInit_ex(t->ipad, EVP_sha256(), NULL) || !EVP_DigestUpdate(t->ipad, pad, 64)) return 0;
        for (i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
        if (!EVP_DigestInit_ex(t->opad, EVP_sha256(), NULL) || !EVP_DigestUpdate(t->opad, pad, 64)) return 0;
        memcpy(t->dir, dir, dlen); t->dir_len = (int) dlen; t->seq = seq;
        return 1;
    }

    /* The 16-byte tag of frame number t->seq whose bytes are a then b. */
    static int lane_tag(lane_tags *t, const unsigned char *a, size_t alen, const unsigned char *b, size_t blen,
                        unsigned char out[32]) {
        unsigned char seq[8], inner[32];
        unsigned int n;
        lane_wr64(seq, (int64_t) t->seq);
        if (!EVP_MD_CTX_copy_ex(t->tmp, t->ipad) || !EVP_DigestUpdate(t->tmp, t->dir, t->dir_len)
                || !EVP_DigestUpdate(t->tmp, seq, 8) || !EVP_DigestUpdate(t->tmp, a, alen)
                || (blen && !EVP_DigestUpdate(t->tmp, b, blen)) || !EVP_DigestFinal_ex(t->tmp, inner, &n))
            return 0;
        if (!EVP_MD_CTX_copy_ex(t->tmp, t->opad) || !EVP_DigestUpdate(t->tmp, inner, 32)
                || !EVP_DigestFinal_ex(t->tmp, out, &n))
            return 0;
        return 1;
    }

    /* GMAC (AES-256-GCM, no plaintext, the data as associated data) of the next block. */
    static int lane_gmac(rmqha_lane *L, const unsigned char *data, int64_t n, unsigned char tag[16]) {
        unsigned char iv[12], scratch[16];
        int outl;
        memset(iv, 0, 4);
        lane_wr64(iv + 4, (int64_t) L->count_in);
        L->count_in++;
        if (!EVP_EncryptInit_ex(L->gcm, NULL, NULL, NULL, iv)) return 0;
        if (n > 0 && !EVP_EncryptUpdate(L->gcm, NULL, &outl, data, (int) n)) return 0;
        if (!EVP_EncryptFinal_ex(L->gcm, scratch, &outl)) return 0;
        return EVP_CIPHER_CTX_ctrl(L->gcm, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
    }

    /* The tag behind the TRANSFER_DATA frame at p (length bytes, then its tag). */
    static int lane_check_tag(rmqha_lane *L, const unsigned char *p, int32_t length) {
        unsigned char g[16], t[32];
        if (!lane_gmac(L, p + LANE_HDR, length - LANE_HDR, g) || !lane_tag(&L->in, p, LANE_HDR, g, 16, t))
            return 0;
        if (CRYPTO_memcmp(t, p + length, LANE_TAG) != 0) return 0;
        L->in.seq++;
        return 1;
    }

    /* --- the log ------------------------------------------------------------------------ */

    /* records.scan over b[pos:end] (positions in the segment): the stop and where. */
    static int lane_scan(rmqha_lane *L, const unsigned char *b, Py_ssize_t pos, Py_ssize_t end,
                         Py_ssize_t *stop_pos) {
        Py_ssize_t size = 0;
        int stop = L->s_end;
        while (pos < end) {
            stop = L->check(b, pos, end, (Py_ssize_t) L->sb, L->seg_base, 1, &size);
            if (stop >= 0) { if (stop == L->s_blank) pos = (Py_ssize_t) L->sb; break; }
            stop = L->s_end;
            pos += size;
        }
        *stop_pos = pos;
        return stop;
    }

    /* ReceivePath._validate_block: a record begun by an earlier block is checked in the
       mapping, the rest of the block where it came from (data, the bytes of seg[pos:end]). */
    static int lane_validate(rmqha_lane *L, Py_ssize_t wpos, const unsigned char *data, Py_ssize_t pos,
                             Py_ssize_t end, Py_ssize_t *stop_pos) {
        Py_ssize_t rec_end = pos;
        int stop;
        if (wpos < pos) {
            rec_end = end;
            if (end - wpos >= 8) {
                int32_t total = lane_rd32(L->seg + wpos);
                if (pos < wpos + total && wpos + total < end) rec_end = wpos + total;
            }
            stop = lane_scan(L, L->seg, wpos, rec_end, stop_pos);
            if (rec_end == end || stop != L->s_end) return stop;
        }
        /* data - pos: the block's bytes addressed by their segment positions (only
           [rec_end, end) is read, which lies in data) */
        return lane_scan(L, data - pos, rec_end, end, stop_pos);
    }

    static int lane_is_bad(rmqha_lane *L, int stop, Py_ssize_t stop_pos, Py_ssize_t end) {
        if (stop != L->s_end && stop != L->s_blank
                && !(stop == L->s_torn || (stop == L->s_zeros && end - stop_pos < 8)))
            return 1;
        return end == L->sb && stop_pos != L->sb;
    }

    static int lane_pwrite(rmqha_lane *L, const unsigned char *data, int64_t n, int64_t pos) {
        int64_t done = 0;
        while (done < n) {
            ssize_t w = pwrite(L->seg_fd, data + done, (size_t) (n - done), (off_t) (pos + done));
            if (w < 0) { if (errno == EINTR) continue; L->err = errno; memset(L->seg + pos, 0, (size_t) done); return 0; }
            done += w;
        }
        return 1;
    }

    /* One block into the log: written, validated, the log moved (or zeroed and refused). */
    static int lane_append(rmqha_lane *L, const unsigned char *data, int64_t block, int64_t size) {
        Py_ssize_t pos = (Py_ssize_t) (block - L->seg_base), end = pos + (Py_ssize_t) size, stop_pos;
        int stop;
        if (block + size <= LD(L->warm)) memcpy(L->seg + pos, data, (size_t) size);
        else if (!lane_pwrite(L, data, size, pos)) return LANE_OSERROR;
        stop = lane_validate(L, (Py_ssize_t) (L->whole - L->seg_base), data, pos, end, &stop_pos);
        if (lane_is_bad(L, stop, stop_pos, end)) {
            memset(L->seg + pos, 0, (size_t) size);
            L->bad_stop = stop; L->bad_block = block; L->bad_at = L->seg_base + stop_pos;
            return LANE_CORRUPT;
        }
        ST(L->whole, L->seg_base + stop_pos);
        ST(L->log_end, block + size);
        return 0;
    }

    static inline void lane_learn(rmqha_lane *L, int64_t confirm) {
        int64_t end = L->log_end, c = confirm < end ? confirm : end;
        if (c > L->learnt) ST(L->learnt, c);
    }

    /* Take the whole plain frames at the front of the buffer: their tags first (a chunk
       at a time), then their blocks.  0, or why the lane stops (the frame it stopped at
       left at the front). */
    static int lane_take(rmqha_lane *L) {
        for (;;) {
            Py_ssize_t pos = L->start;
            int n = 0, why = 0;
            int64_t at = L->log_end, room = L->seg_base + LD(L->limit);
            uint64_t seq0 = L->in.seq, count0 = L->count_in;
            while (n < LANE_CHUNK && L->end - pos >= 8) {
                const unsigned char *p = L->buf + pos;
                int32_t length = lane_rd32(p);
                int64_t size, block, confirm, estart;
                if (lane_rd32(p + 4) != 6 || length < LANE_HDR || length > L->max_frame) { why = LANE_OTHER; break; }
                if (L->end - pos < (Py_ssize_t) length + L->tag) {
                    if ((Py_ssize_t) length + L->tag > L->cap) why = LANE_BIG;
                    break;
                }
                size = length - LANE_HDR;
                block = lane_rd64(p + 24); estart = lane_rd64(p + 32); confirm = lane_rd64(p + 40);
                if (lane_rd64(p + 16) != L->epoch || estart != L->epoch_start || block != at || estart > block
                        || (size > 0 && confirm < 0)) { why = LANE_OTHER; break; }
                if (block + size > room) { why = LANE_ROOM; break; }
                if (L->mac && !lane_check_tag(L, p, length)) return LANE_AUTH;
                L->spans[n].pos = pos; L->spans[n].size = size; L->spans[n].block = block; L->spans[n].confirm = confirm;
                n++;
                at = block + size;
                pos += length + L->tag;
            }
            if (why == LANE_OTHER) {
                /* As frames.scan_transfer_run: nothing of this chunk is taken, the Python
                   path reads it all (and refuses what it must before any of it is used);
                   the tags checked here are checked again there. */
                L->in.seq = seq0; L->count_in = count0;
                return why;
            }
            for (int i = 0; i < n; i++) {
                lane_span *s = &L->spans[i];
                if (s->size) {
                    int r = lane_append(L, L->buf + s->pos + LANE_HDR, s->block, s->size);
                    if (r) return r;
                    ST(L->blocks, L->blocks + 1);
                    ST(L->suspend, 0);
                } else {
                    ST(L->heartbeats, L->heartbeats + 1);
                    ST(L->suspend, 1);
                }
                lane_learn(L, s->confirm);
            }
            if (pos == L->end) L->start = L->end = 0;
            else L->start = pos;
            if (why || n < LANE_CHUNK) return why;
        }
    }

    /* --- the socket ---------------------------------------------------------------------- */

    static int lane_ack(rmqha_lane *L, int64_t now) {
        unsigned char f[LANE_HDR], t[32];
        int64_t end = L->log_end;
        int len = 32;
        ssize_t w;
        lane_wr32(f, 32); lane_wr32(f + 4, 7);
        lane_wr64(f + 8, lane_clock(CLOCK_REALTIME) / 1000000);
        lane_wr64(f + 16, L->epoch);
        lane_wr64(f + 24, end);
        if (L->mac) {
            if (!lane_tag(&L->out, f, 32, NULL, 0, t)) { L->err = EIO; return LANE_OSERROR; }
            L->out.seq++;
            memcpy(f + 32, t, LANE_TAG);
            len += LANE_TAG;
        }
        ST(L->acked, end);
        for (;;) {
            w = send(L->fd, f, (size_t) len, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w >= 0 || errno != EINTR) break;
        }
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) w = 0;
            else { L->err = errno; return errno == EPIPE || errno == ECONNRESET ? LANE_CLOSED : LANE_OSERROR; }
        }
        ST(L->bytes_out, L->bytes_out + w);
        ST(L->acks, L->acks + 1);
        if (w < len) {  /* the socket is full: the Python side sends the rest */
            memcpy(L->unsent, f + w, (size_t) (len - w));
            L->unsent_len = len - (int) w;
            return LANE_SEND;
        }
        ST(L->last_write_ns, now);
        return 0;
    }

    /* Wake the Python side for progress, unless a wake-up is pending already. */
    static void lane_signal(rmqha_lane *L) {
        uint64_t one = 1;
        if (L->log_end == L->signalled_end && L->learnt == L->signalled_learnt) return;
        if (__atomic_exchange_n(&L->pending, 1, __ATOMIC_ACQ_REL)) return;
        L->signalled_end = L->log_end; L->signalled_learnt = L->learnt;
        if (write(L->event_fd, &one, 8) < 0) { /* a counter at its maximum: a wake-up is due anyway */ }
    }

    static int lane_loop(rmqha_lane *L) {
        int r = lane_take(L);
        if (r) return r;
        for (;;) {
            Py_ssize_t room;
            ssize_t n;
            int64_t now;
            if (LD(L->stopping)) return LANE_STOPPED;
            if (L->end == L->cap) {  /* only a partial frame is left: move it to the front */
                memmove(L->buf, L->buf + L->start, (size_t) (L->end - L->start));
                L->end -= L->start; L->start = 0;
            }
            room = L->cap - L->end;
            if (room <= 0) return LANE_BIG;  /* (cannot happen: a whole frame was taken) */
            n = recv(L->fd, L->buf + L->end, (size_t) room, MSG_DONTWAIT);
            now = lane_clock(CLOCK_MONOTONIC);
            if (n > 0) {
                L->end += n;
                ST(L->bytes_in, L->bytes_in + n);
                ST(L->last_read_ns, now);
                r = lane_take(L);
                if (r) return r;
                /* receive.py's rule: a read that left room drained the socket (live
                   traffic: ack now); otherwise ack every LANE_ACK_EVERY bytes. */
                if ((L->log_end != L->acked && (n < room || L->log_end - L->acked >= LANE_ACK_EVERY))
                        || now - L->last_write_ns >= L->heartbeat_ns) {
                    r = lane_ack(L, now);
                    if (r) return r;
                }
                lane_signal(L);
                continue;
            }
            if (n == 0) return LANE_CLOSED;
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) { L->err = errno; return LANE_OSERROR; }
            /* The stream paused: the master hears where this log ends now. */
            if (L->log_end != L->acked || now - L->last_write_ns >= L->heartbeat_ns) {
                r = lane_ack(L, now);
                if (r) return r;
            }
            lane_signal(L);
            {
                int64_t wait = L->heartbeat_ns - (now - L->last_write_ns);
                int64_t silent = L->housekeeping_ns - (now - L->last_read_ns);
                struct pollfd fds[2];
                if (silent <= 0) return LANE_TIMEOUT;
                if (silent < wait) wait = silent;
                if (wait <= 0) continue;  /* a heartbeat ack is due */
                fds[0].fd = L->fd; fds[0].events = POLLIN; fds[0].revents = 0;
                fds[1].fd = L->stop_fd; fds[1].events = POLLIN; fds[1].revents = 0;
                if (poll(fds, 2, (int) ((wait + 999999) / 1000000)) < 0 && errno != EINTR) {
                    L->err = errno; return LANE_OSERROR;
                }
            }
        }
    }
    """
    ctypedef int (*lane_check_fn)(const unsigned char *, Py_ssize_t, Py_ssize_t, Py_ssize_t, int64_t, bint,
                                  Py_ssize_t *) noexcept nogil
    ctypedef struct lane_tags:
        uint64_t seq
    ctypedef struct rmqha_lane:
        int fd, stop_fd, event_fd
        unsigned char *buf
        Py_ssize_t cap, start, end
        unsigned char *seg
        int seg_fd
        int64_t seg_base, sb, max_frame, epoch, epoch_start, heartbeat_ns, housekeeping_ns
        int tag
        lane_check_fn check
        int s_end, s_blank, s_torn, s_zeros
        int64_t limit, warm, log_end, whole, learnt, acked, blocks, heartbeats, bytes_in, bytes_out, acks
        int64_t last_read_ns, last_write_ns, signalled_end, signalled_learnt
        int stopping, pending, suspend
        int why, err, bad_stop
        int64_t bad_block, bad_at
        unsigned char unsent[48]
        int unsent_len
        int mac
        lane_tags in_ "in"
        lane_tags out
        void *gcm
        uint64_t count_in
    int LANE_STOPPED, LANE_OTHER, LANE_ROOM, LANE_BIG, LANE_TIMEOUT, LANE_CLOSED, LANE_OSERROR
    int LANE_CORRUPT, LANE_AUTH, LANE_SEND
    int lane_loop(rmqha_lane *L) nogil
    int lane_tags_init(lane_tags *t, const unsigned char *key, size_t klen, const unsigned char *dir,
                       size_t dlen, uint64_t seq)
    void lane_tags_free(lane_tags *t)
    int64_t lane_clock(int clock_id) nogil
    int CLOCK_MONOTONIC
    int EFD_NONBLOCK, EFD_CLOEXEC
    int eventfd(unsigned int initval, int flags)
    long lane_write_u64 "write" (int fd, const void *buf, size_t n)
    long lane_read_u64 "read" (int fd, void *buf, size_t n)
    int lane_close "close" (int fd)
    void *EVP_CIPHER_CTX_new()
    void EVP_CIPHER_CTX_free(void *ctx)
    const void *EVP_aes_256_gcm()
    int EVP_EncryptInit_ex(void *ctx, const void *cipher, void *engine, const unsigned char *key,
                           const unsigned char *iv)
    int64_t LD(int64_t x) nogil
    void ST(...) nogil
    int LDI "LD" (int x) nogil
    void XCHG_PENDING "__atomic_store_n" (int *p, int v, int order) nogil
    int ATOMIC_RELEASE "__ATOMIC_RELEASE"

#: Why a run of the lane ended (:attr:`SlaveLane.why`).
STOPPED = LANE_STOPPED  # stop() was called
OTHER = LANE_OTHER      # a frame the Python path must read is at the buffer's front
ROOM = LANE_ROOM        # the next block goes beyond the room the log granted
BIG = LANE_BIG          # the next frame is larger than the receive buffer
TIMEOUT = LANE_TIMEOUT  # the master was silent for the housekeeping interval
CLOSED = LANE_CLOSED    # the master closed the link
OSERROR = LANE_OSERROR  # a socket or file error (errno in :attr:`SlaveLane.err`)
CORRUPT = LANE_CORRUPT  # a block with an invalid record (zeroed; bad_* say where)
AUTH = LANE_AUTH        # a frame whose tag does not check
SEND = LANE_SEND        # an ack the socket took only part of (the rest in :attr:`SlaveLane.unsent`)

cdef int _S_END = int(ScanStop.END)
cdef int _S_BLANK = int(ScanStop.BLANK)
cdef int _S_TORN = int(ScanStop.TORN)
cdef int _S_ZEROS = int(ScanStop.ZEROS)


cdef class SlaveLane:
    """One HA slave session's compiled receive lane (see the module docstring).

    ``arm`` lends it the socket, the receive buffer and the segment; ``run`` (on the lane's
    own thread) loops until one of the stop reasons above; ``stop`` asks it to end from any
    thread; ``disarm`` returns what it borrowed.  The counters may be read at any time."""

    cdef rmqha_lane L
    cdef Py_buffer _rbuf
    cdef Py_buffer _seg
    cdef bint _have_rbuf, _have_seg, _running

    def __cinit__(self):
        memset(&self.L, 0, sizeof(rmqha_lane))
        self.L.fd = self.L.seg_fd = -1
        self.L.stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        self.L.event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.L.stop_fd < 0 or self.L.event_fd < 0:
            raise OSError("eventfd failed")

    def __dealloc__(self):
        self._release()
        if self.L.stop_fd >= 0:
            lane_close(self.L.stop_fd)
        if self.L.event_fd >= 0:
            lane_close(self.L.event_fd)
        lane_tags_free(&self.L.in_)
        lane_tags_free(&self.L.out)
        if self.L.gcm != NULL:
            EVP_CIPHER_CTX_free(self.L.gcm)

    cdef void _release(self):
        if self._have_rbuf:
            PyBuffer_Release(&self._rbuf)
            self._have_rbuf = False
        if self._have_seg:
            PyBuffer_Release(&self._seg)
            self._have_seg = False

    @property
    def event_fd(self):
        """Readable when the lane has progress to report (read it with :meth:`take_event`)."""
        return self.L.event_fd

    def arm(self, int fd, buf, Py_ssize_t start, Py_ssize_t end, segment, int seg_fd, int64_t seg_base,
            int64_t segment_bytes, int64_t limit, int64_t warm, int64_t log_end, int64_t whole,
            int64_t epoch, int64_t epoch_start, int64_t max_frame, int64_t heartbeat_ms,
            int64_t housekeeping_ms, int64_t last_read_ns, int64_t last_write_ns, int64_t acked):
        """Lend the lane a run's state: the socket ``fd``; the receive buffer ``buf`` with
        unparsed bytes at ``start..end``; the active segment's mapping ``segment`` (its file
        ``seg_fd``, global offset ``seg_base``), writable up to position ``limit``,
        faulted in below global offset ``warm``; the log's max and whole offsets; its last
        epoch entry; the timers; the monotonic times (ns) of the last read and write; the
        offset last acked.  The MAC, if any, is set with :meth:`set_mac` after this."""
        if self._running:
            raise RuntimeError("the lane is running")
        self._release()
        PyObject_GetBuffer(buf, &self._rbuf, PyBUF_WRITABLE)
        self._have_rbuf = True
        PyObject_GetBuffer(segment, &self._seg, PyBUF_WRITABLE)
        self._have_seg = True
        if (start < 0 or start > end or end > self._rbuf.len or self._seg.len < segment_bytes
                or limit > segment_bytes or log_end < seg_base or whole > log_end or whole < seg_base
                or max_frame < 48):
            self._release()
            raise ValueError(f"lane arm: bad state (buffer {start}..{end} of {self._rbuf.len}, segment "
                             f"{self._seg.len}/{segment_bytes}, limit {limit}, log {seg_base}..{whole}..{log_end})")
        cdef rmqha_lane *L = &self.L
        L.fd = fd
        L.buf = <unsigned char *> self._rbuf.buf
        L.cap = self._rbuf.len
        L.start = start
        L.end = end
        L.seg = <unsigned char *> self._seg.buf
        L.seg_fd = seg_fd
        L.seg_base = seg_base
        L.sb = segment_bytes
        L.limit = limit
        L.warm = warm
        L.log_end = log_end
        L.whole = whole
        L.learnt = -1
        L.acked = acked
        L.epoch = epoch
        L.epoch_start = epoch_start
        L.max_frame = max_frame
        L.heartbeat_ns = heartbeat_ms * 1000000
        L.housekeeping_ns = housekeeping_ms * 1000000
        L.last_read_ns = last_read_ns
        L.last_write_ns = last_write_ns
        L.check = _check_record
        L.s_end, L.s_blank, L.s_torn, L.s_zeros = _S_END, _S_BLANK, _S_TORN, _S_ZEROS
        L.blocks = L.heartbeats = L.bytes_in = L.bytes_out = L.acks = 0
        L.signalled_end = log_end
        L.signalled_learnt = -1
        L.stopping = L.pending = L.suspend = 0
        L.why = L.err = L.bad_stop = 0
        L.bad_block = L.bad_at = 0
        L.unsent_len = 0
        L.mac = 0
        L.tag = 0
        cdef uint64_t drain
        while lane_read_u64(L.stop_fd, &drain, 8) == 8:
            pass

    def set_mac(self, bytes in_key, bytes in_direction, uint64_t in_seq, bytes out_key, bytes out_direction,
                uint64_t out_seq, bytes block_key, uint64_t block_count):
        """Authenticated link: the receiving direction's tag key, label and next sequence
        number, the sending direction's, and the GMAC key and count of received blocks."""
        if (not lane_tags_init(&self.L.in_, in_key, len(in_key), in_direction, len(in_direction), in_seq)
                or not lane_tags_init(&self.L.out, out_key, len(out_key), out_direction, len(out_direction),
                                      out_seq)):
            raise ValueError("lane MAC: could not set up the tag keys")
        if len(block_key) != 32:
            raise ValueError(f"lane MAC: a GMAC key of {len(block_key)} bytes (32 expected)")
        if self.L.gcm == NULL:
            self.L.gcm = EVP_CIPHER_CTX_new()
        if self.L.gcm == NULL or not EVP_EncryptInit_ex(self.L.gcm, EVP_aes_256_gcm(), NULL, block_key, NULL):
            raise ValueError("lane MAC: could not set up the GMAC key")
        self.L.count_in = block_count
        self.L.mac = 1
        self.L.tag = 16

    def run(self):
        """Loop until a stop reason (returned, and kept in :attr:`why`); call on the lane's
        own thread: no GIL is held until it returns."""
        cdef int why
        if not self._have_rbuf:
            raise RuntimeError("the lane is not armed")
        self._running = True
        try:
            with nogil:
                why = lane_loop(&self.L)
        finally:
            self._running = False
        self.L.why = why
        return why

    def stop(self):
        """Ask a run to end (any thread; the run returns STOPPED at its next boundary)."""
        cdef uint64_t one = 1
        XCHG_PENDING(&self.L.stopping, 1, ATOMIC_RELEASE)
        lane_write_u64(self.L.stop_fd, &one, 8)

    def disarm(self):
        """After a run: give back the buffer and the segment; (start, end) of what is left
        unparsed in the buffer."""
        if self._running:
            raise RuntimeError("the lane is running")
        self._release()
        return self.L.start, self.L.end

    def take_event(self):
        """Clear the pending wake-up (before reading the counters, so none is lost)."""
        cdef uint64_t value
        XCHG_PENDING(&self.L.pending, 0, ATOMIC_RELEASE)
        lane_read_u64(self.L.event_fd, &value, 8)

    def set_room(self, int64_t limit, int64_t warm):
        """The log reserved more of the segment (``limit``) or faulted more in (``warm``)."""
        if limit > self.L.sb:
            limit = self.L.sb
        if limit > LD(self.L.limit):
            ST(self.L.limit, limit)
        if warm > LD(self.L.warm):
            ST(self.L.warm, warm)

    def progress(self):
        """(whole offset, max offset): consistent (the whole offset is read first)."""
        cdef int64_t whole = LD(self.L.whole)
        return whole, LD(self.L.log_end)

    @property
    def learnt(self):
        """The master's confirm offset learnt from the blocks taken (-1: none)."""
        return LD(self.L.learnt)

    @property
    def acked(self):
        return LD(self.L.acked)

    @property
    def blocks(self):
        return LD(self.L.blocks)

    @property
    def heartbeats(self):
        return LD(self.L.heartbeats)

    @property
    def bytes_in(self):
        return LD(self.L.bytes_in)

    @property
    def bytes_out(self):
        return LD(self.L.bytes_out)

    @property
    def acks(self):
        return LD(self.L.acks)

    @property
    def suspended(self):
        """Whether the last frame taken was a heartbeat (caught up: SUSPEND)."""
        return LDI(self.L.suspend) != 0

    @property
    def last_read_ns(self):
        return LD(self.L.last_read_ns)

    @property
    def last_write_ns(self):
        return LD(self.L.last_write_ns)

    @property
    def frames_in(self):
        """Frames whose tags were checked (authenticated links)."""
        return self.L.in_.seq

    @property
    def frames_out(self):
        return self.L.out.seq

    @property
    def blocks_in(self):
        """The GMAC count of received blocks (authenticated links)."""
        return self.L.count_in

    @property
    def why(self):
        return self.L.why

    @property
    def err(self):
        return self.L.err

    @property
    def bad(self):
        """(block offset, record offset, ScanStop) of a CORRUPT stop."""
        return self.L.bad_block, self.L.bad_at, self.L.bad_stop

    @property
    def unsent(self):
        return PyBytes_FromStringAndSize(<const char *> self.L.unsent, self.L.unsent_len)


def monotonic_ns():
    """CLOCK_MONOTONIC in ns (what ``time.monotonic`` reads, as the lane's timers)."""
    return lane_clock(CLOCK_MONOTONIC)
