"""What the server holds of the machine: the unit it counts memory in (``MB``), the disk it keeps free
(``MIN_FREE_DISK``), and freed memory handed back to the OS, so that a public server's RSS returns after a burst
of requests.

glibc keeps freed heap pages in its arenas (one per thread that allocated, up to 8 per core) for reuse, so
a request that allocates large temporaries on a worker thread (RISE's batches of masked images, a failed
load of a big checkpoint) leaves its peak in that thread's arena. Measured with the bundled model, 100
RISE requests at once (``tests/test_app_security.py``): RSS 874 -> 940 MB with glibc's default arenas,
870 -> 895 MB and then flat over two more bursts with ``limit_arenas``.
"""

from __future__ import annotations

import ctypes
import gc
import platform

M_ARENA_MAX = -8  # glibc's mallopt parameter
MB = 2**20
MIN_FREE_DISK = 1 << 30  # uploads, training photos and jobs that would leave less free on their disk are refused


def limit_arenas(n: int = 2) -> bool:
    """Let at most ``n`` malloc arenas serve all threads (``mallopt(M_ARENA_MAX, n)``), before the server
    starts its worker threads: Gradio runs each request on whichever thread of its pool is free, and every
    arena keeps its own high-water mark of freed pages. Whether glibc took it (False outside glibc)."""
    return _LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, n) == 1


def release_memory(generation: int = 2) -> None:
    """Collect reference cycles (a failed load's traceback holds its frames) up to ``generation`` (2: all;
    a full collection takes about half a second in the app, the young generations milliseconds), then ask
    glibc to return the free pages of every arena (``malloc_trim(0)``, about a millisecond)."""
    gc.collect(generation)
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()
