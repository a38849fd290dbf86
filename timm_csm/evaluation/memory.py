"""Handing the freed memory of glibc's heap back to the operating system.

glibc's ``malloc`` keeps freed blocks for reuse. Over an evaluation pass its heap keeps pages of freed tensors (our
reading: its mmap threshold adapts upwards once such blocks are freed, and the heap fragments), so the resident
size grows with the number of batches although nothing stays alive (``benchmarks/data.md``: 1.38x peak RSS from 10k
to 100k images, set in validation and evaluation; 1.03x with this call in ``predict``). ``malloc_trim(0)`` returns
the free pages inside the heap, whatever their position. Under an allocator preloaded in glibc's place (tcmalloc,
jemalloc) the call finds glibc's heap unused and does nothing.
"""
from __future__ import annotations

import ctypes

__all__ = ["release_freed_memory"]


def _find_malloc_trim():
    try:
        libc = ctypes.CDLL(None)  # the C library the interpreter already runs on
    except (OSError, TypeError):  # Windows has no process-wide symbol table to open
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only: not on macOS, musl or Windows
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()


def release_freed_memory() -> bool:
    """Return the free pages of glibc's heaps to the operating system (``malloc_trim(0)``). False where the C
    library has no such call; nothing is lost then but the saving."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
