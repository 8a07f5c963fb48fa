"""Files on the server's disk that outlive nothing: uploads cut off mid-way, and what a dead process left.

- **Uploads removed when the request ends, however it ends.** Gradio writes each uploaded file to a
  ``tmp*`` file as it arrives and renames it into its cache when the upload is complete; it removes the
  temporary files only for the errors of its own parser, so a client that hung up (or a request cancelled,
  or a name refused after parsing) left them: 20 uploads cut off at 20 MB left 400 MB. ``remove_partial_uploads``
  wraps the upload route's parsing so that, on any exception, the files it had not yet renamed are removed.
- **Every file in a folder of its process's own** (``process_folder``: ``<tmp>/vit-app-*``): Gradio's uploads and
  cache (``use_own_folders`` points ``GRADIO_TEMP_DIR`` there before the page is built), Batch's CSVs, the Train
  tab's jobs. The process holds a shared lock on the folder's ``.in-use`` for its life (the kernel drops it when
  the process dies, however it dies) and removes the folder when it exits normally; at start a server removes the
  folders whose lock it can take (``sweep_dead_folders``): those of dead processes only, so that two app processes
  on one machine, local or public, in any order, never remove each other's files (Gradio's shared
  ``/tmp/gradio`` is no longer swept: other apps may be using it). A killed server left its visitors' photos,
  models and Gradio's copies for good before (1,071 files 40 minutes later).
"""

from __future__ import annotations

import atexit
import contextvars
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import IO, Any

from ..errors import log
from .gradio_patches import wrap_uploads

_partial: contextvars.ContextVar[list[IO[bytes]] | None] = contextvars.ContextVar("partial_uploads", default=None)


def remove_partial_uploads() -> None:
    """Make Gradio's upload route remove its temporary files when the request fails in any way (idempotent)."""
    wrap_uploads(_tracked, _removing)


def _tracked(parse: Callable[..., Any]) -> Callable[..., Any]:
    async def parse_tracked(self: Any) -> Any:
        files = _partial.get()
        try:
            return await parse(self)
        finally:
            if files is not None:
                files.extend(self._files_to_close_on_error)  # every file it opened, renamed or not

    return parse_tracked


def _removing(upload_fn: Callable[..., Any]) -> Callable[..., Any]:
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

    return upload_removing


def _remove(f: IO[bytes]) -> None:
    try:
        f.close()
        os.unlink(f.name)
    except OSError:  # renamed into the cache already, or removed by Gradio
        pass


_owned: list[IO[str]] = []  # the locks of this process's own folders, held for its life
# Where the app's own folders are made: under Gradio's folder when one was set for the process (GRADIO_TEMP_DIR, as
# the process started), else the system's temporary folder.
TEMP_ROOT = Path(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir())


def own_folder(prefix: str, root: Path = TEMP_ROOT) -> Path:
    """A new temporary folder ``<root>/<prefix>*`` that this process holds (a shared lock on its ``.in-use``
    for the life of the process), so that ``sweep_dead_folders`` tells it apart from a dead process's."""
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    lock = (folder / ".in-use").open("a")
    fcntl.flock(lock, fcntl.LOCK_SH)
    _owned.append(lock)
    return folder


UNLOCKED_STALE_S = 86400.0  # a folder without ``own_folder``'s lock file (an older version's) is removed after a day


PROCESS_PREFIX = "vit-app-"


@cache
def process_folder() -> Path:
    """This process's own temporary folder (``<root>/vit-app-*``, held by it: ``own_folder``), removed when the
    process exits normally; a dead one's goes at the next server's start (``use_own_folders``)."""
    folder = own_folder(PROCESS_PREFIX)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def use_own_folders() -> int:
    """At a server's start: remove the folders of dead app processes, and keep Gradio's uploads and cache in this
    process's folder (before the page is built: Gradio reads ``GRADIO_TEMP_DIR`` then). Returns the folders
    removed."""
    removed = sweep_dead_folders(PROCESS_PREFIX)
    log.info("this process's temporary files: %s", process_folder())
    (gradio := process_folder() / "gradio").mkdir(exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(gradio)
    return removed


def sweep_dead_folders(prefix: str, started: float | None = None, root: Path = TEMP_ROOT) -> int:
    """Remove the ``<root>/<prefix>*`` folders no live process holds (``own_folder``'s lock can be taken) and
    that are older than ``started`` (default now: one being made this instant has no lock yet); one without a
    lock file only when untouched for ``UNLOCKED_STALE_S``. Returns how many."""
    started = time.time() if started is None else started
    removed = 0
    for folder in root.glob(f"{prefix}*"):
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
        log.info("removed %d folders that dead processes of the app left", removed)
    return removed
