# Declarations of the compiled records codec, cimported by rmqha._core.pull_answer so the
# pull answer checks body CRCs with the same C code (CLMUL folding) and no Python call.
from libc.stdint cimport int64_t, uint32_t


cdef uint32_t body_crc_c(const unsigned char* p, size_t n) noexcept nogil


# One record's checks (rmqha._core.slave_lane validates replicated blocks with them, the
# same code scan() runs): -1 for a valid message (its size in size_out) or a ScanStop code.
cdef int _check_record(const unsigned char* b, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t seg_end,
                       int64_t base_offset, bint verify, Py_ssize_t* size_out) noexcept nogil
