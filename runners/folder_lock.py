"""One runner at a time per run folder.

Two commands given the same ``output_dir`` (or a ``resume=DIR`` while the run is still going,
or a sweep job started twice) wrote the same ``result.json``, checkpoints and logs in turn,
and the folder ended with a mixture of both runs that nothing flagged (noticed 2 Dec 2026).
A runner now holds ``RUN_DIR/.devplace.lock`` with ``flock`` while it writes the folder; a
second one is refused at once, naming the first (its runner, pid, host and start time).

The lock belongs to the open file, so it goes when the process ends however it ends (a
``kill -9`` included): there is never a stale lock to delete by hand. The small file stays
in the folder. On a file system without ``flock`` the runner goes on unlocked.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The lock file inside a run folder.
LOCK_FILE = ".devplace.lock"


class FolderInUse(ValueError):
    """The run folder is held by another runner (a user error: one line, exit status 2)."""


def _message(folder: Path, holder: str) -> str:
    return (
        f"{folder} is in use by {holder}: two runners writing one folder replace each "
        "other's files; wait for it to end, or give another output_dir"
    )


def _unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF)


def holder(folder: str | Path) -> str | None:
    """Who holds ``folder``'s lock (the line it wrote), or ``None`` when no runner does.

    Only looks: creates nothing, takes nothing (a shared lock, released at once)."""
    import fcntl

    path = Path(folder) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 500, 0).decode(errors="replace").strip()
            return text or "another runner"
        except OSError as exc:
            if _unsupported(exc):
                return None
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def check_free(folder: str | Path) -> None:
    """:class:`FolderInUse` when another runner holds ``folder``."""
    who = holder(folder)
    if who is not None:
        raise FolderInUse(_message(Path(folder), who))


@contextmanager
def held(folder: str | Path, app: str) -> Iterator[None]:
    """Hold ``folder``'s lock for runner ``app`` for the ``with`` block, or raise
    :class:`FolderInUse` (before anything is written) when another runner holds it."""
    import fcntl

    folder = Path(folder)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        locked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 500, 0).decode(errors="replace").strip()
            raise FolderInUse(_message(folder, text or "another runner")) from None
        except OSError as exc:
            if not _unsupported(exc):
                raise
            locked = False
        if locked:
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            line = f"runners.{app} (pid {os.getpid()} on {socket.gethostname()}, since {since})"
            os.ftruncate(fd, 0)
            os.pwrite(fd, (line + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)
