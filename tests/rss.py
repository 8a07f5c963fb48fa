"""Resident memory of a process and its peak over a call, for tests that check what decoding or a request costs."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _status(key: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def rss_mb(pid: int | str = "self") -> float:
    """The process's resident memory now, in MiB."""
    return _status("VmRSS", pid) / 2**20


def reset_peak(pid: int | str = "self") -> int:
    """Reset the process's peak RSS (VmHWM) to its current RSS, which is returned."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status("VmRSS", pid)


def peak_above(pid: int | str, rss_before: int) -> int:
    """How far the process's RSS peaked above ``rss_before`` since ``reset_peak``."""
    return _status("VmHWM", pid) - rss_before


def peak_of(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and how many bytes this process's RSS peaked above where it stood before the call (the
    allocator's free pages handed back first, so that they are not reused and hidden)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = reset_peak()
    out = fn()
    return out, peak_above("self", before)
