"""Launch one process per rank on this host; if one rank fails, kill the rest and re-raise its error."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.dist import free_port

#: Each run folder this package makes in the system's temporary directory names its owner
#: in this file (``PID HOST``: the pid, and the host and pid namespace it is a pid of), so
#: that a folder left behind by a killed run (SIGKILL skips ``TemporaryDirectory``'s cleanup)
#: is removed by the next run on the same host.
OWNER_FILE = ".devplace_owner"
#: Prefix of every such folder (``devplace_exec_``, ``devplace_spawn_``, ...).
TMP_PREFIX = "devplace_"


def _host_id() -> str:
    """This host and pid namespace: a pid means something only there (containers may share
    a temporary directory and have pid namespaces of their own)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "-"
    return f"{socket.gethostname()}|{ns}".replace(" ", "_")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def sweep_stale_run_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the ``devplace_*`` folders under ``root`` (default: the system's temporary
    directory) that this user owns and whose owner process (:data:`OWNER_FILE`), on this
    host and pid namespace, is gone. Kept: live runs' folders, other users', other hosts' or
    namespaces', and folders without a readable owner file. Returns the folders removed."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    here, removed = _host_id(), []
    for d in base.glob(TMP_PREFIX + "*"):
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            pid_text, host = (d / OWNER_FILE).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if host == here and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


@contextlib.contextmanager
def run_folder(prefix: str) -> Iterator[str]:
    """``tempfile.TemporaryDirectory(prefix=prefix)`` that records this process as its
    owner, after sweeping the folders of killed runs (:func:`sweep_stale_run_folders`)."""
    if not prefix.startswith(TMP_PREFIX):
        raise ValueError(f"run_folder: prefix {prefix!r} must start with {TMP_PREFIX!r}")
    sweep_stale_run_folders()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        (Path(tmp) / OWNER_FILE).write_text(f"{os.getpid()} {_host_id()}")
        yield tmp


class RankFailure(RuntimeError):
    """A rank of a distributed job failed; carries that rank's error.

    Attributes:
        rank: the rank that failed first.
        error_type: the exception class name raised there (or ``"exit"``/``"timeout"``).
        remote_traceback: the formatted traceback from that rank, if any.
        exit_codes: exit code of every rank (negative = killed by that signal).
    """

    def __init__(
        self,
        rank: int,
        error_type: str,
        message: str,
        remote_traceback: str = "",
        exit_codes: Sequence[int | None] = (),
    ) -> None:
        who = f"rank {rank}" if rank >= 0 else "the job"  # -1: no one rank (a timeout)
        super().__init__(f"{who} failed with {error_type}: {message}")
        self.rank = rank
        self.error_type = error_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.exit_codes = list(exit_codes)


def write_error_file(
    path: str | Path, rank: int, exc: BaseException, when: float | None = None
) -> None:
    """Record ``exc`` raised on ``rank`` at time ``when`` as JSON (read by the launcher)."""
    Path(path).write_text(
        json.dumps(
            {
                "rank": rank,
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
                "time": time.time() if when is None else when,
            }
        )
    )


#: Messages that are symptoms of a peer's death rather than a cause.
PEER_FAILURE_PATTERNS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "broken pipe",
    "timed out",
    "timeout",
)


def is_peer_symptom(message: str) -> bool:
    """True when an error message only says that another rank went away."""
    m = message.lower()
    return any(p in m for p in PEER_FAILURE_PATTERNS)


def read_error_files(folder: str | Path) -> list[dict[str, Any]]:
    """All error records in ``folder`` (``error_rank*.json``): root causes first, then
    errors that are symptoms of a dead peer (see :func:`is_peer_symptom`), each group
    earliest first."""
    out = []
    for p in sorted(Path(folder).glob("error_rank*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(out, key=lambda r: (is_peer_symptom(r.get("message", "")), r.get("time", 0.0)))


def describe_exit(code: int | None) -> str:
    """What an exit code says about a rank: killed by a signal, left early, or failed."""
    if code is None:
        return "was still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    if code == 0:
        return "left early (returned while the other ranks were still running)"
    return f"exited with code {code} without reporting an error"


def first_failure(
    records: Sequence[Mapping[str, Any]],
    exits: Mapping[int, tuple[int, float]],
    exit_codes: Sequence[int | None] = (),
) -> RankFailure | None:
    """The rank to blame for a failed job, as a :class:`RankFailure`.

    ``records`` are the ranks' error files (:func:`read_error_files`); ``exits`` maps a
    rank to ``(exit code, unix time)`` for every rank seen to exit *before* the launcher
    stopped the rest (exit 0 included). In order of blame:

    1. the earliest error that is not a symptom of a dead peer (:func:`is_peer_symptom`);
    2. the earliest rank that died without an error record (killed by a signal: a
       negative code; or a non-zero code), else the earliest that left early (exit 0
       while others failed): such a rank writes nothing, and its peers only report a
       closed connection. A rank ended by SIGTERM comes after all of these, since
       launchers stop the survivors with it;
    3. the earliest symptom.
    """
    by_rank = {int(r.get("rank", -1)): r for r in records}
    peers = sorted(r for r in by_rank if is_peer_symptom(by_rank[r].get("message", "")))
    after = f"; ranks {peers} then lost their connection to it" if peers else ""
    roots = [r for r in records if not is_peer_symptom(r.get("message", ""))]
    if roots:
        e = min(roots, key=lambda r: r.get("time", 0.0))
        return RankFailure(e["rank"], e["type"], e["message"], e["traceback"], exit_codes)
    failed = any(c != 0 for c, _ in exits.values()) or bool(records)
    # a rank killed or failing silently outranks one that merely returned before the others,
    # and a rank a launcher stopped (SIGTERM) comes after both
    silent = [
        (c == -15, c == 0, t, r, c)
        for r, (c, t) in exits.items()
        if r not in by_rank and (c != 0 or failed)
    ]
    if silent:
        *_, r, c = min(silent)
        kind = "signal" if c < 0 else ("left_early" if c == 0 else "exit")
        return RankFailure(r, kind, f"rank {r} {describe_exit(c)}{after}", "", exit_codes)
    if records:
        e = min(records, key=lambda r: r.get("time", 0.0))
        return RankFailure(e["rank"], e["type"], e["message"], e["traceback"], exit_codes)
    return None


def with_silent_exits(
    exits: Mapping[int, tuple[int, float]],
    nproc: int,
    records: Sequence[Mapping[str, Any]],
    finished: set[int],
) -> dict[int, tuple[int, float]]:
    """``exits`` plus ``(0, 0.0)`` for every rank that left no trace: not among the failures
    torchrun lists, no error record, no result record. Such a rank returned (exit 0) before
    the end, which torchrun does not list as a failure; :func:`first_failure` then blames it
    as having left early rather than the peers that saw its connection close."""
    out = dict(exits)
    seen = {int(r.get("rank", -1)) for r in records} | set(finished) | set(out)
    for r in range(nproc):
        if r not in seen:
            out[r] = (0, 0.0)
    return out


def torchrun_failures(log: str) -> dict[int, tuple[int, float]]:
    """``{rank: (exit code, unix time)}`` of the failures torchrun's summary lists.

    The rank under "Root Cause (first observed failure)" is given the earliest time: the
    summary prints whole seconds, and ranks torchrun stopped often share its second."""
    out: dict[int, tuple[int, float]] = {}
    pat = re.compile(
        r"time\s*:\s*(?P<time>[^\n]+)\n\s*host\s*:[^\n]*\n\s*rank\s*:\s*(?P<rank>\d+)"
        r"[^\n]*\n\s*exitcode\s*:\s*(?P<code>-?\d+)"
    )
    from datetime import datetime

    log = log or ""
    root = log.rfind("Root Cause")
    root_rank = None
    for m in pat.finditer(log):
        when = 0.0
        try:
            when = datetime.strptime(m["time"].strip(), "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            pass
        out.setdefault(int(m["rank"]), (int(m["code"]), when))
        if root >= 0 and m.start() > root and root_rank is None:
            root_rank = int(m["rank"])
    if root_rank is not None and len(out) > 1:
        # the summary's times are whole seconds: a rank torchrun stopped (SIGTERM) in the
        # same second as the root cause would tie with it; torchrun's own choice decides
        first = min(t for r, (_, t) in out.items() if r != root_rank)
        code, when = out[root_rank]
        out[root_rank] = (code, min(when, first - 0.5))
    return out


#: Modules the fork server imports once (:func:`rank_context`): every rank forked from it
#: starts with torch and the runtime loaded instead of importing them again (2-3 s of CPU
#: per process on this project's CPU machines for torch, and another 2-2.5 s for the
#: runners: ``runtime.hybrid`` brings in ``runtime.pipeline`` / ``tensor_parallel`` /
#: ``program`` with ``torch.distributed.pipelining`` and DTensor; ``torch.export._trace`` is
#: what the first ``torch.export`` of each rank would import).
PRELOAD = ("torch", "torch.distributed", "numpy", "runtime.worker", "runtime.hybrid",
           "torch.export._trace")  # fmt: skip

#: How :func:`rank_context` starts ranks, from the environment variable of that name.
START_METHOD_VAR = "DEVPLACE_START_METHOD"


def rank_context() -> Any:
    """The ``multiprocessing`` context that starts the ranks of :func:`spawn` (and so of
    :func:`runtime.execute.run_spec` on one host): ``forkserver`` where the platform has it
    -- a server process imports :data:`PRELOAD` once (it touches no device: CUDA is first
    initialised in each rank, after the fork) and every rank is forked from it -- else
    ``spawn`` (a fresh interpreter per rank). ``DEVPLACE_START_METHOD=spawn`` forces fresh
    interpreters; any other value than ``forkserver`` or ``spawn`` is refused by name."""
    method = os.environ.get(START_METHOD_VAR, "")
    if method not in ("", "forkserver", "spawn"):
        raise ValueError(
            f"{START_METHOD_VAR}={method!r}: expected 'forkserver' (the default where the "
            "platform has it) or 'spawn'"
        )
    if method != "spawn" and preload_fork_server():
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def preload_fork_server() -> bool:
    """Ask the process's ``multiprocessing`` fork server to import :data:`PRELOAD` when it
    starts; ``False`` where the platform has none. Only the first start counts: a server
    that another library started first (stable-baselines3's ``SubprocVecEnv`` uses the
    fork server too; :func:`agents.ppo.make_vec_env` calls this before it) forks ranks that
    import torch themselves, as fresh interpreters do."""
    if "forkserver" not in mp.get_all_start_methods():
        return False
    mp.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    return True


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    env: Mapping[str, str],
    folder: str,
    args: tuple[Any, ...],
    log: str | None = None,
) -> None:
    # a forked rank inherits the fork server's environment: take the launcher's instead
    os.environ.clear()
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    if log is not None:  # this rank's stdout and stderr (warnings, prints) go to its log file
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for std in (1, 2):
            os.dup2(fd, std)
        os.close(fd)
    try:
        result = fn(*args)
        Path(folder, f"result_rank{rank}.json").write_text(json.dumps(result))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        write_error_file(Path(folder, f"error_rank{rank}.json"), rank, exc, time.time())
        raise SystemExit(1) from None


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    timeout_s: float = 120.0,
    grace_s: float = 1.0,
    env: Mapping[str, str] | None = None,
    folder: str | Path | None = None,
    logs: bool = False,
) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` processes (started by :func:`rank_context`:
    forked from a server that imported torch once, or fresh interpreters) and return their
    results.

    Each process gets this process's environment plus ``env``, ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and a free ``MASTER_PORT``; ``fn`` must be importable
    (a module-level function) and return a JSON-serialisable value. If a rank exits
    non-zero, the survivors get ``grace_s`` seconds, then are terminated (SIGTERM, then
    SIGKILL) and :class:`RankFailure` is raised with the first failing rank's error
    (``error_rank{r}.json`` records, which ``fn`` may write itself into ``folder``). If the job runs past ``timeout_s`` every
    rank is killed and ``RankFailure`` (type ``"timeout"``) is raised. ``folder``: where
    the ranks' records go (default: a temporary folder); ``logs``: each rank's stdout and
    stderr go to ``folder/rank{r}.log`` instead of this process's.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size must be >= 1, got {world_size}")
    ctx = rank_context()
    base_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    base_env.update(env or {})
    with run_folder("devplace_spawn_") as tmp:
        folder = str(folder if folder is not None else tmp)
        procs = [
            ctx.Process(
                target=_child,
                args=(fn, r, world_size, base_env, folder, args)
                + ((str(Path(folder, f"rank{r}.log")),) if logs else ()),
                name=f"devplace-rank{r}",
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        failed_at: float | None = None
        timed_out = False
        exits: dict[int, tuple[int, float]] = {}  # rank -> (code, time) seen before _kill
        try:
            while True:
                codes = [p.exitcode for p in procs]
                for r, c in enumerate(codes):
                    if c is not None and r not in exits:
                        exits[r] = (c, time.time())
                if all(c == 0 for c in codes):
                    break
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = time.monotonic()
                if failed_at is not None and (
                    all(c is not None for c in codes) or time.monotonic() - failed_at > grace_s
                ):
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:
            _kill(procs)
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            exits = {}
        for r in range(world_size):  # returned from fn, but still exiting when stopped
            done = Path(folder, f"result_rank{r}.json")
            if r not in exits and done.exists() and any(c != 0 for c in codes):
                exits[r] = (0, done.stat().st_mtime)
        failure = first_failure(read_error_files(folder), exits, codes)
        if failure is not None:
            raise failure
        if timed_out:
            raise RankFailure(-1, "timeout", f"job did not finish within {timeout_s} s", "", codes)
        if any(c != 0 for c in codes):
            r = next(i for i, c in enumerate(codes) if c != 0)
            raise RankFailure(r, "exit", f"rank {r} {describe_exit(codes[r])}", "", codes)
        return [
            json.loads(Path(folder, f"result_rank{r}.json").read_text()) for r in range(world_size)
        ]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), read from ``/proc``
    (Linux; an empty list elsewhere). torchrun starts each worker in a session of its own,
    so killing torchrun's process group leaves them running."""
    parent: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            stat = Path("/proc", e, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parent[int(e)] = int(fields[1])
    out: list[int] = []
    frontier = {pid}
    while frontier:
        kids = [c for c, pp in parent.items() if pp in frontier]
        out += kids
        frontier = set(kids)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and every process below it (:func:`descendants`)."""
    below = descendants(pid)
    for target in [pid, *below]:
        try:
            os.killpg(os.getpgid(target), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    t0 = time.monotonic()
    for p in procs:
        p.join(timeout=max(0.0, 3.0 - (time.monotonic() - t0)))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
