# Declarations of the compiled epoch map, cimported by rmqha._core.ha_offsets so batch
# limiting reads the entries without Python calls.
from libc.stdint cimport int64_t


cdef class EpochMapCore:
    cdef int64_t *_epochs
    cdef int64_t *_starts
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef int64_t _max_offset

    cdef int _reserve(self, Py_ssize_t need) except -1
    cdef inline int64_t _end(self, Py_ssize_t i) noexcept
    cdef Py_ssize_t _find_epoch(self, int64_t epoch) noexcept
    cdef Py_ssize_t _find_offset(self, int64_t offset) noexcept
    cdef tuple _entry(self, Py_ssize_t i)
    cpdef append(self, epoch, start)
    cdef bint _load_sorted_triples(self, object items, int64_t *re, int64_t *rs, int64_t *rend,
                                   Py_ssize_t n) except -1
    cdef object _consistent_point(self, const int64_t *re, const int64_t *rs, const int64_t *rend,
                                  Py_ssize_t rn, int64_t rmax)
