# Declarations of the compiled records codec, cimported by rmqha._core.pull_answer so the
# pull answer checks body CRCs with the same C code (CLMUL folding) and no Python call.
from libc.stdint cimport uint32_t


cdef uint32_t body_crc_c(const unsigned char* p, size_t n) noexcept nogil
