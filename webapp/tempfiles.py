"""Files on the server's disk that outlive nothing: uploads cut off mid-way, and what a dead process left.

- **Uploads removed when the request ends, however it ends.** Gradio writes each uploaded file to a
  ``tmp*`` file as it arrives and renames it into its cache when the upload is complete; it removes the
  temporary files only for the errors of its own parser, so a client that hung up (or a request cancelled,
  or a name refused after parsing) left them: 20 uploads cut off at 20 MB left 400 MB. ``remove_partial_uploads``
  wraps the upload route's parsing so that, on any exception, the files it had not yet renamed are removed.
- **A start-up sweep** (``sweep``): files in the app's upload folder (and batch CSVs) older than this process
  are what a dead process left (OOM kill, ``kill -9``: 1,071 files were still there 40 minutes later).
  Each app process holds a shared lock on ``.in-use`` in that folder for its lifetime (the kernel drops it when
  the process dies, however it dies); a process that can take the lock exclusively at start is the only one
  using the folder and removes everything older than itself. Only in public mode, where the folder is the
  app's own: on a developer's machine ``/tmp/gradio`` may be shared with other Gradio apps.
- **Folders of a process's own** (``own_folder``, ``sweep_dead_folders``): the Train tab's jobs run in a
  ``vit-train-*`` temporary folder per process, locked the same way; at start a server removes those whose
  process is gone (a killed server left its visitors' photos and models there for good).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from gradio import route_utils, routes

from .errors import log

_partial: contextvars.ContextVar[list[IO[bytes]] | None] = contextvars.ContextVar("partial_uploads", default=None)
_lock: IO[str] | None = None  # held for the life of the process


def remove_partial_uploads() -> None:
    """Make Gradio's upload route remove its temporary files when the request fails in any way (idempotent)."""
    parser = route_utils.GradioMultiPartParser
    if getattr(parser.parse, "removes_partial", False):
        return
    parse, upload_fn = parser.parse, routes.upload_fn

    async def parse_tracked(self: Any) -> Any:
        files = _partial.get()
        try:
            return await parse(self)
        finally:
            if files is not None:
                files.extend(self._files_to_close_on_error)  # every file it opened, renamed or not

    async def upload_removing(*args: Any, **kwargs: Any) -> Any:
        files: list[IO[bytes]] = []
        token = _partial.set(files)
        try:
            return await upload_fn(*args, **kwargs)
        except BaseException:  # a disconnect, a cancellation, a limit: the partial files go
            for f in files:
                _remove(f)
            raise
        finally:
            _partial.reset(token)

    parse_tracked.removes_partial = True  # type: ignore[attr-defined]
    parser.parse = parse_tracked
    routes.upload_fn = upload_removing


def _remove(f: IO[bytes]) -> None:
    try:
        f.close()
        os.unlink(f.name)
    except OSError:  # renamed into the cache already, or removed by Gradio
        pass


def sweep(folders: list[Path], started: float | None = None) -> int:
    """Remove what is older than this process (``started``, default now) under each of ``folders``, unless
    another live process uses the first (its lock); then hold the lock shared. Returns the files removed."""
    global _lock
    started = time.time() if started is None else started
    folders[0].mkdir(parents=True, exist_ok=True)
    lock = (folders[0] / ".in-use").open("a")
    removed = 0
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("not sweeping %s: another process of the app uses it", folders[0].name)
    else:
        for folder in folders:
            removed += _sweep(folder, started, lock.name)
        if removed:
            log.info("removed %d files a previous process left", removed)
    fcntl.flock(lock, fcntl.LOCK_SH)  # downgrade: later processes see this one alive
    _lock = lock
    return removed


def _sweep(folder: Path, started: float, keep: str) -> int:
    removed = 0
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            try:
                if path != keep and os.lstat(path).st_mtime < started:
                    os.unlink(path)
                    removed += 1
            except OSError:
                pass
        for name in dirs:
            with contextlib.suppress(OSError):  # not empty (a file newer than this process), or gone
                os.rmdir(os.path.join(root, name))
    return removed


_owned: list[IO[str]] = []  # the locks of this process's own folders, held for its life


def own_folder(prefix: str) -> Path:
    """A new temporary folder ``<tmp>/<prefix>*`` that this process holds (a shared lock on its ``.in-use``
    for the life of the process), so that ``sweep_dead_folders`` tells it apart from a dead process's."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    lock = (folder / ".in-use").open("a")
    fcntl.flock(lock, fcntl.LOCK_SH)
    _owned.append(lock)
    return folder


UNLOCKED_STALE_S = 86400.0  # a folder without ``own_folder``'s lock file (an older version's) is removed after a day


def sweep_dead_folders(prefix: str, started: float | None = None) -> int:
    """Remove the ``<tmp>/<prefix>*`` folders no live process holds (``own_folder``'s lock can be taken) and
    that are older than ``started`` (default now: one being made this instant has no lock yet); one without a
    lock file only when untouched for ``UNLOCKED_STALE_S``. Returns how many."""
    started = time.time() if started is None else started
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            if not folder.is_dir() or folder.is_symlink() or folder.stat().st_mtime >= started:
                continue
            if not (folder / ".in-use").exists():
                if folder.stat().st_mtime < started - UNLOCKED_STALE_S:
                    shutil.rmtree(folder)
                    removed += 1
                continue
            with (folder / ".in-use").open("r") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a live process holds it
                shutil.rmtree(folder)
            removed += 1
        except OSError:  # held (BlockingIOError), someone else's, or gone
            continue
    if removed:
        log.info("removed %d training folders a previous process left", removed)
    return removed
