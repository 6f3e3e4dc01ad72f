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
from typing import Any

#: The lock file inside a run folder.
LOCK_FILE = ".devplace.lock"


class FolderInUse(ValueError):
    """The run folder is held by another runner (a user error: one line, exit status 2)."""


#: The locks this process holds: real path of the folder -> open file of its lock.
_HELD: dict[str, int] = {}


def _message(folder: Path, holder: str) -> str:
    return (
        f"{folder} is in use by {holder}: two runners writing one folder replace each "
        "other's files; wait for it to end (or, for a new run, give another output_dir)"
    )


def _holder_text(fd: int) -> str:
    """The line the holder of the lock file ``fd`` wrote."""
    return os.pread(fd, 500, 0).decode(errors="replace").strip() or "another runner"


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
            return _holder_text(fd)
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


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """The lock file's descriptor and whether it is writable. A lock file another user made
    (mode 0644 under the usual umask) is opened read-only: ``flock`` needs no write access.
    A folder where the file belongs is refused by name (it was an ``IsADirectoryError``
    traceback, 2 Dec 2026)."""
    if path.is_dir():
        raise ValueError(
            f"{path} is a folder, not devplace's lock file; remove it (runners keep their "
            "lock there while they write the run folder)"
        )
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
    except PermissionError:
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError as exc:
            raise ValueError(
                f"{path}: cannot open the run folder's lock file ({exc.strerror}); "
                "give an output_dir you can write"
            ) from None


def acquire(folder: str | Path, app: str) -> None:
    """Take ``folder``'s lock for runner ``app`` until :func:`release` or the process ends
    (a no-op when this process holds it already), or raise :class:`FolderInUse` naming the
    holder before anything is written there."""
    import fcntl

    folder = Path(folder)
    key = os.path.realpath(folder)
    if key in _HELD:
        return
    fd, writable = _open_lock_file(folder / LOCK_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = _holder_text(fd)
        os.close(fd)
        raise FolderInUse(_message(folder, text)) from None
    except OSError as exc:
        os.close(fd)
        if not _unsupported(exc):
            raise
        return  # no flock on this file system: go on unlocked
    if writable:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        line = f"runners.{app} (pid {os.getpid()} on {socket.gethostname()}, since {since})"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (line + "\n").encode(), 0)
    _HELD[key] = fd


def release(folder: str | Path) -> None:
    """Give ``folder``'s lock back (if this process holds it)."""
    fd = _HELD.pop(os.path.realpath(Path(folder)), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def held(folder: str | Path, app: str) -> Iterator[None]:
    """Hold ``folder``'s lock for runner ``app`` for the ``with`` block, or raise
    :class:`FolderInUse` (before anything is written) when another runner holds it. A lock
    this process took already (:class:`LockRunFolder`, before hydra wrote its files) is kept
    as it is, and not given back here."""
    if os.path.realpath(Path(folder)) in _HELD:
        yield
        return
    acquire(folder, app)
    try:
        yield
    finally:
        release(folder)


#: What a run folder held before hydra rewrote its ``.hydra/`` for this process's run (real
#: path of the folder -> snapshot), for :func:`put_back_hydra` when the command fails.
_EARLIER_HYDRA: dict[str, dict[str, Any]] = {}

#: The files whose bytes tell whether a failed command left the folder the earlier run's.
_RUN_MARKERS = ("config.yaml", "result.json", "results.md")


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def remember_hydra(folder: str | Path, subdir: str) -> None:
    """Keep the bytes of ``folder/subdir`` (hydra's ``.hydra/``) and of the folder's
    ``config.yaml`` and ``result.json``, before hydra writes its files for this run."""
    folder = Path(folder)
    files = sorted(p for p in (folder / subdir).rglob("*") if p.is_file())
    if files:
        rel = {str(p.relative_to(folder / subdir)): p.read_bytes() for p in files}
        replace_hydra_snapshot(folder, subdir, rel)


def put_back_hydra(folder: str | Path) -> bool:
    """After a failed or refused command: give ``folder`` back the ``.hydra/`` files that
    :func:`remember_hydra` kept, when the folder is still the earlier run's (its
    ``config.yaml`` and ``result.json`` unchanged: a new training run that failed after its
    first checkpoint owns the folder, and keeps its own). Whether it did."""
    import shutil

    snap = _EARLIER_HYDRA.pop(os.path.realpath(Path(folder)), None)
    folder = Path(folder)
    if snap is None or any(_read(folder / n) != b for n, b in snap["markers"].items()):
        return False
    target = folder / snap["subdir"]
    shutil.rmtree(target, ignore_errors=True)
    for rel, data in snap["files"].items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    return True


def hydra_snapshot(folder: str | Path) -> tuple[str, dict[str, bytes]] | None:
    """What :func:`remember_hydra` kept of ``folder``'s ``.hydra/``: ``(subdir, files)``."""
    snap = _EARLIER_HYDRA.get(os.path.realpath(Path(folder)))
    return None if snap is None else (snap["subdir"], dict(snap["files"]))


def replace_hydra_snapshot(folder: str | Path, subdir: str, files: dict[str, bytes]) -> None:
    """Keep ``files`` as the ``.hydra/`` to give ``folder`` back if this command fails, with
    the folder's ``config.yaml`` and ``result.json`` as they are now (the earlier run's,
    just put back from ``.earlier_run/`` after a killed command)."""
    folder = Path(folder)
    _EARLIER_HYDRA[os.path.realpath(folder)] = {
        "subdir": subdir,
        "files": dict(files),
        "markers": {n: _read(folder / n) for n in _RUN_MARKERS},
    }


def forget_hydra(folder: str | Path) -> None:
    """The command succeeded: the folder's ``.hydra/`` is its own."""
    _EARLIER_HYDRA.pop(os.path.realpath(Path(folder)), None)


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency
    Callback = object  # type: ignore[misc,assignment]


class LockRunFolder(Callback):  # type: ignore[misc]
    """A hydra callback (``hydra.callbacks.folder_lock`` in each runner's config) that takes
    the run folder's lock when hydra starts a run, before it writes ``.hydra/`` there.

    Checked on the command line's text alone, a folder given quoted or through an
    interpolation (``output_dir="busy"``, ``output_dir=${oc.env:PWD}/busy``), and two runs
    started in one second with hydra's default folder, were refused only after hydra had
    replaced the running run's ``.hydra/`` files (fuzzing, 2 Dec 2026). A sweep (``-m``)
    holds its sweep folder from its start; each job takes its own folder's lock when the job
    starts (:func:`runners.common.reported_errors`), after hydra wrote the job's ``.hydra/``."""

    def __init__(self, app: str) -> None:
        self.app = app

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        resume = OmegaConf.select(config, "resume", default=None)
        if resume:
            from runners.schema import is_train_run_folder

            if not is_train_run_folder(Path(str(resume))):
                return  # resume= of a folder that is no run: refused by the runner, untouched
        if not resume and _timestamped(config, "run"):
            self._take_own(config, "run")  # a folder no run used: nothing to keep
            return
        self._take(config, "hydra.run.dir")
        # a refused command rewrote the earlier run's .hydra/ (its overrides no longer the
        # run's): kept here, put back by runners.common.reported_errors (3 Dec 2026)
        folder, subdir = _folder(config, "hydra.run.dir"), _folder(config, "hydra.output_subdir")
        if folder is not None and subdir is not None:
            remember_hydra(folder, str(subdir))

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        self._release(config, "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        """A sweep holds its sweep folder (``hydra.sweep.dir``) until it ends: the same
        sweep started twice rewrote the first one's jobs' ``.hydra/`` files before each job
        was refused (fuzzing, 2 Dec 2026); its jobs hold their own folders too."""
        if _timestamped(config, "sweep"):
            self._take_own(config, "sweep")
            return
        self._take(config, "hydra.sweep.dir")
        # an earlier sweep's jobs: hydra rewrites a job's .hydra/ before the job starts, so a
        # job refused in an earlier job's folder left that job's result beside the refused
        # command's overrides; kept here, put back by runners.common.reported_errors (3 Dec
        # 2026; the jobs of launchers that run them in other processes are not covered)
        sweep, subdir = _folder(config, "hydra.sweep.dir"), _folder(config, "hydra.output_subdir")
        if sweep is not None and subdir is not None and sweep.is_dir():
            for hydra_dir in sorted(sweep.rglob(str(subdir))):
                if hydra_dir.is_dir() and hydra_dir.parent != sweep:
                    remember_hydra(hydra_dir.parent, str(subdir))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self._release(config, "hydra.sweep.dir")

    def _take(self, config: Any, key: str) -> None:
        folder = _folder(config, key)
        if folder is not None:
            self._lock(folder, busy_ok=False)

    def _lock(self, folder: Path, *, busy_ok: bool) -> bool:
        """Make ``folder`` and take its lock; ``False`` when another runner holds it and
        ``busy_ok``, else any failure is one error line and exit status 2."""
        import sys

        try:
            folder.mkdir(parents=True, exist_ok=True)
            acquire(folder, self.app)
        except (ValueError, OSError) as exc:
            if busy_ok and isinstance(exc, FolderInUse):
                return False
            sys.stderr.write(f"error: {exc}\n")
            raise SystemExit(2) from None
        return True

    def _take_own(self, config: Any, mode: str) -> None:
        """Hold a folder of its own for a run (``mode`` "run") or a sweep ("sweep") whose
        folder is named by the clock (hydra's default ``outputs/APP/DATE/TIME``): the first of
        ``TIME``, ``TIME_1``, ``TIME_2``, ... that no runner holds and no earlier run used.

        Runs started in the same second, e.g. seeds launched in the background by a shell
        loop, were given one folder: all but the first were refused (2 Dec 2026), and a run
        started in the second an earlier one ended would have cleared that run's files."""
        import sys

        from omegaconf import read_write

        key = f"hydra.{mode}.dir"
        base = _folder(config, key)
        if base is None:
            return
        for i in range(10_000):
            folder = base if i == 0 else base.with_name(f"{base.name}_{i}")
            if not self._lock(folder, busy_ok=True):
                continue
            if any(p.name != LOCK_FILE for p in folder.iterdir()):
                release(folder)  # an earlier run's folder: keep its files
                continue
            break
        else:  # pragma: no cover - ten thousand runs in one second
            sys.stderr.write(f"error: no free run folder next to {base}; give output_dir\n")
            raise SystemExit(2)
        if folder == base:
            return
        with read_write(config.hydra):
            config.hydra[mode].dir = str(folder)
            if mode == "sweep":
                # hydra composes each job's config again from these overrides (with the
                # same clock): without this one the jobs went to the folder held by another
                from runners.schema import hydra_quoted

                config.hydra.overrides.hydra.append(f"{key}={hydra_quoted(str(folder))}")

    def _release(self, config: Any, key: str) -> None:
        folder = _folder(config, key)
        if folder is not None:
            release(folder)


def _folder(config: Any, key: str) -> Path | None:
    """The folder ``config`` names at ``key``, or ``None`` (unset, or resolved by hydra only
    later: a sweep's jobs then lock their own folders)."""
    from omegaconf import OmegaConf

    try:
        folder = OmegaConf.select(config, key)
    except Exception:  # noqa: BLE001 - omegaconf's resolution errors
        return None
    return Path(str(folder)) if folder else None


def _timestamped(config: Any, mode: str) -> bool:
    """Whether hydra names the folder of this run (``mode`` "run") or sweep ("sweep") by the
    clock (``${now:...}`` in ``hydra.run.dir`` / ``hydra.sweep.dir``, no ``output_dir``)
    rather than the user by a path."""
    from omegaconf import OmegaConf

    if mode == "run" and OmegaConf.select(config, "output_dir", default=None):
        return False
    try:
        raw = OmegaConf.to_container(config.hydra[mode], resolve=False).get("dir")
    except Exception:  # noqa: BLE001 - no such node: nothing to rename
        return False
    return isinstance(raw, str) and "${now:" in raw
