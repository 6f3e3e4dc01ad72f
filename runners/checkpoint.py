"""Atomic training checkpoints and exact resume for SB3 runs (model, envs, RNGs, callbacks).

A checkpoint is one file, ``RUN_DIR/checkpoint.pkl``, replaced atomically (temp file +
``os.replace``), taken between PPO updates. It holds everything the rest of the run
depends on: the SB3 model (policy, optimizer, step counters, last observation), the
vectorised environments mid-episode (their RNGs and oracle state), the global python /
numpy / torch RNG states and the callbacks' state. Resuming from it therefore replays
the remaining updates exactly as an uninterrupted run with the same seed would.

The pickle (the vectorised envs mid-episode cannot be written any other way) comes after
a one-line header that :func:`load` checks before anything is unpickled::

    devplace-checkpoint {"version": 2, "bytes": N, "hmac_sha256": HEX}\n<N bytes of pickle>

The HMAC is keyed with a per-user secret (:func:`key_path`, created on first use, mode
0600), so a truncated file, a foreign pickle, a checkpoint of another user or machine, or
an altered one is refused unread, naming the file and how to restart.

:class:`SessionClock` keeps a run's wall-clock time across resumes (``wall_clock.json``),
a ``kill -9``-ed session included.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import pickle
import random
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from graphs.schema import is_number, show
from runners.common import write_bytes_atomic

CHECKPOINT = "checkpoint.pkl"
VERSION = 2
#: First bytes of every checkpoint file (then a JSON header line, then the pickle).
MAGIC = b"devplace-checkpoint "
#: Longest header line :func:`load` reads.
_HEADER_MAX = 512
#: Environment variable naming the key file (default ``~/.config/devplace/checkpoint.key``).
KEY_ENV = "DEVPLACE_CHECKPOINT_KEY_FILE"
#: The key of the checkpoint's ``extra`` holding :func:`config_digest` of the run.
CONFIG_DIGEST = "config_sha256"
#: Keys of the unpickled state, as :func:`save` writes them.
_STATE_KEYS = frozenset({"version", "algo", "model", "env", "rng", "callbacks", "extra"})

#: Callback attributes that point at the live run rather than hold its state.
_LIVE_ATTRS = frozenset(
    {"model", "training_env", "locals", "globals", "logger", "parent", "callback", "on_improve"}
)


def rng_state() -> dict[str, Any]:
    """The global python, numpy and torch RNG states."""
    import torch  # here, not at the top: a bad setting is refused before torch is imported

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - SB3 uses the global RNG
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])


def callback_state(cb: Any) -> dict[str, Any]:
    """The picklable state of an SB3 callback: its attributes minus references to the live
    run (the model, envs, loggers and the names in the callback's ``live_attrs``)."""
    live = _LIVE_ATTRS | set(getattr(cb, "live_attrs", ()))
    return {k: v for k, v in vars(cb).items() if k not in live}


def key_path() -> Path:
    """The file holding this user's checkpoint signing key (``$DEVPLACE_CHECKPOINT_KEY_FILE``,
    else ``$XDG_CONFIG_HOME/devplace/checkpoint.key``, else ``~/.config/devplace/...``)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "devplace" / "checkpoint.key"


def _key() -> bytes:
    """This user's signing key, created (32 random bytes, mode 0600) on first use."""
    path = key_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # atomic publish: a racing process keeps the first key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(
            f"checkpoint key file {path} does not hold a hex key of at least 16 bytes; "
            "delete it (a new one is made) or point ${KEY_ENV} at a valid one"
        )
    return key


def check_key() -> None:
    """Make sure the signing key can be read (or made) now: ``ValueError`` naming the file and
    ``$DEVPLACE_CHECKPOINT_KEY_FILE`` otherwise. A read-only home, or the variable naming a
    folder, failed with an ``OSError`` traceback at the first checkpoint, after the
    baselines and a rollout (fuzzing, 2 Dec 2026)."""
    try:
        _key()
    except OSError as exc:
        raise ValueError(
            f"checkpoint key file {key_path()} cannot be read or made ({exc.strerror}); "
            f"point ${KEY_ENV} at a file you can write, or set train.checkpoint_every=0"
        ) from None


def _sign(payload: bytes) -> str:
    return hmac.new(_key(), payload, hashlib.sha256).hexdigest()


def save(
    run_dir: Path,
    model: Any,
    *,
    callbacks: Sequence[Any] = (),
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``RUN_DIR/checkpoint.pkl`` atomically (signed header, then the pickle); return its path."""
    buf = io.BytesIO()
    model.save(buf)
    state = {
        "version": VERSION,
        "algo": type(model),
        "model": buf.getvalue(),
        "env": model.get_env(),
        "rng": rng_state(),
        "callbacks": [callback_state(cb) for cb in callbacks],
        # the config.yaml the run was started with: resume= refuses the checkpoint if it
        # was edited since (cluster: k40_2 -> k40_4 trained on in the 2-device envs, fuzzing)
        "extra": {**dict(extra or {}), CONFIG_DIGEST: config_digest(run_dir)},
    }
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    header = {"version": VERSION, "bytes": len(payload), "hmac_sha256": _sign(payload)}
    path = Path(run_dir) / CHECKPOINT
    write_bytes_atomic(path, MAGIC + json.dumps(header).encode() + b"\n" + payload)
    return path


def config_digest(run_dir: str | Path) -> str | None:
    """SHA-256 of ``RUN_DIR/config.yaml`` (``None`` when there is none)."""
    try:
        return hashlib.sha256((Path(run_dir) / "config.yaml").read_bytes()).hexdigest()
    except OSError:
        return None


def exists(run_dir: str | Path) -> bool:
    return (Path(run_dir) / CHECKPOINT).exists()


def _restart_hint(path: Path) -> str:
    return (
        f"it is not unpickled. Delete it to restart this run from the beginning "
        f"(rm {path}; resume={path.parent} then starts over), or start a new run without resume="
    )


def verify(path: str | Path) -> bytes:
    """The pickle of checkpoint ``path`` once its header proves this project wrote it for
    this user, complete and unaltered; ``ValueError`` naming the file and how to restart."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"resume: cannot read {path} ({exc.strerror})") from None
    if not raw.startswith(MAGIC):
        raise ValueError(
            f"resume: {path}: field 'header' is {show(raw[:24])}; expected the signed devplace "
            f"header {MAGIC!r} (a devplace checkpoint of version {VERSION}: older checkpoints "
            f"and foreign pickles are refused unread); {_restart_hint(path)}"
        )
    end = raw.find(b"\n", 0, _HEADER_MAX)
    head = raw[len(MAGIC) : end if end >= 0 else _HEADER_MAX]
    try:
        header = json.loads(head)
        if not isinstance(header, dict):
            raise ValueError("not an object")
        version, size, mac = header["version"], header["bytes"], header["hmac_sha256"]
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"resume: {path}: field 'header' is {show(head[:40])}; expected a JSON object with "
            f"version, bytes and hmac_sha256 ({type(exc).__name__}: {exc}); {_restart_hint(path)}"
        ) from None
    if version != VERSION:
        raise ValueError(
            f"resume: {path}: header field 'version' is {show(version)}; this version of "
            f"devplace reads {VERSION}; {_restart_hint(path)}"
        )
    payload = raw[end + 1 :]
    if type(size) is not int or len(payload) != size:
        raise ValueError(
            f"resume: {path} is truncated or padded: header field 'bytes' is {show(size)} but "
            f"{len(payload)} bytes follow; {_restart_hint(path)}"
        )
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _sign(payload)):
        raise ValueError(
            f"resume: {path} does not carry this user's signature: header field "
            f"'hmac_sha256' is {show(str(mac)[:16])}... but the contents sign differently with "
            f"the key {key_path()}: the file was written with another key (another user or "
            f"machine) or altered since; {_restart_hint(path)}. To resume a run copied from "
            f"another machine, point ${KEY_ENV} at that machine's key file."
        )
    return payload


def load(run_dir: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`: verified first (:func:`verify`), then
    unpickled and its fields checked; ``ValueError`` naming the file otherwise."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        raise ValueError(f"resume: {path} does not exist; was the run checkpointed?")
    payload = verify(path)
    try:
        state = pickle.loads(payload)  # noqa: S301 - signed by this user's key, see verify()
    except Exception as exc:  # noqa: BLE001 - e.g. a class renamed since the run
        raise ValueError(
            f"resume: {path} is signed but cannot be unpickled by this version of the code "
            f"({type(exc).__name__}: {exc}); {_restart_hint(path)}"
        ) from None
    _check_state(state, path)
    saved, now = state["extra"].get(CONFIG_DIGEST), config_digest(run_dir)
    if saved is not None and saved != now:
        raise ValueError(
            f"resume: {path} was written by a run of another config than "
            f"{Path(run_dir) / 'config.yaml'} (edited since, or replaced by another run's): "
            f"resuming would train on the checkpoint's problem under the config's name; "
            f"{_restart_hint(path)}"
        )
    return state


def _check_state(state: Any, path: Path) -> None:
    from stable_baselines3.common.base_class import BaseAlgorithm

    def bad(field: str, value: Any, expected: str) -> ValueError:
        return ValueError(
            f"resume: {path}: field {field!r} is {show(value)}; expected {expected}; "
            f"{_restart_hint(path)}"
        )

    if not isinstance(state, dict):
        raise bad("(top level)", state, "an object")
    if set(state) != _STATE_KEYS:
        raise bad("(top level)", sorted(state), f"the fields {sorted(_STATE_KEYS)}")
    if state["version"] != VERSION:
        raise bad("version", state["version"], f"{VERSION}")
    if not (isinstance(state["algo"], type) and issubclass(state["algo"], BaseAlgorithm)):
        raise bad("algo", state["algo"], "an SB3 algorithm class")
    if not isinstance(state["model"], bytes):
        raise bad("model", state["model"], "the bytes of an SB3 model zip")
    if not (isinstance(state["rng"], dict) and set(state["rng"]) == {"python", "numpy", "torch"}):
        raise bad("rng", state["rng"], "the python, numpy and torch RNG states")
    if not (
        isinstance(state["callbacks"], list)
        and all(isinstance(c, dict) for c in state["callbacks"])
    ):
        raise bad("callbacks", state["callbacks"], "a list of callback states")
    if not isinstance(state["extra"], dict):
        raise bad("extra", state["extra"], "an object")


def restore(state: Mapping[str, Any], callbacks: Sequence[Any] = ()) -> Any:
    """Rebuild the model on its saved envs, then restore RNGs and callback state."""
    algo = state["algo"]
    model = algo.load(io.BytesIO(state["model"]), env=state["env"], device="cpu", force_reset=False)
    from agents.ppo import quiet_logger

    quiet_logger(model)  # load() drops the logger make_ppo set
    for cb, cb_state in zip(callbacks, state["callbacks"], strict=False):
        vars(cb).update(cb_state)
    # load() reseeds the global generators; put back the ones of the killed run.
    set_rng_state(state["rng"])
    return model


# ------------------------------------------------------------------ wall clock
WALL_CLOCK = "wall_clock.json"


class SessionClock:
    """Wall-clock seconds of a run over all its sessions (the first and every resume).

    ``start()`` appends a session ``[start, last]`` (unix seconds) to
    ``RUN_DIR/wall_clock.json`` and a daemon thread moves ``last`` to now every
    ``interval`` seconds, so a session killed with ``kill -9`` still counts up to its last
    tick; :meth:`total` is the sum over all sessions. ``stop()`` writes the final tick.
    """

    def __init__(self, run_dir: str | Path, interval: float = 1.0) -> None:
        self.path = Path(run_dir) / WALL_CLOCK
        self.interval = interval
        self.sessions: list[list[float]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _read(self) -> list[list[float]]:
        """The sessions so far: none without a file (a new run); ``ValueError`` naming the
        file for one that is not what :meth:`_tick` writes (``[[0, Infinity]]`` gave
        ``wall_seconds`` null, ``[[0, 1e9]]`` a billion seconds, and a damaged file was
        read as none, all without a word: fuzzing, 2 Dec 2026)."""
        if not self.path.exists():
            return []
        now = time.time()
        try:
            data = json.loads(self.path.read_text())
            sessions = data["sessions"]
            if not isinstance(sessions, list):
                raise TypeError("'sessions' is not a list")
            out = []
            for s in sessions:
                if not (isinstance(s, list) and len(s) == 2):
                    raise TypeError(f"session {show(s)} is not [start, end]")
                a, b = s
                if not all(is_number(x) and 0 <= x <= now + 60 for x in (a, b)) or b < a:
                    raise ValueError(
                        f"session {show(s)}: expected unix seconds, start <= end <= now"
                    )
                out.append([float(a), float(b)])
            return out
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"resume: {self.path} is not a run's wall clock ({type(exc).__name__}: {exc}); "
                f"it counts the run's seconds over its sessions: delete it to count from now"
            ) from None

    def _tick(self) -> None:
        with self._lock:
            self.sessions[-1][1] = time.time()
            write_bytes_atomic(self.path, json.dumps({"sessions": self.sessions}).encode())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._tick()
            except OSError:
                pass  # a full disk must not kill training; the last good tick stays

    def start(self, already: float = 0.0) -> SessionClock:
        """Begin a session that started ``already`` seconds ago."""
        now = time.time()
        self.sessions = [*self._read(), [now - already, now]]
        self._tick()
        self._thread = threading.Thread(target=self._run, name="wall-clock", daemon=True)
        self._thread.start()
        return self

    def total(self) -> float:
        """Seconds of every session so far, this one up to now."""
        with self._lock:
            done = sum(b - a for a, b in self.sessions[:-1])
            return done + time.time() - self.sessions[-1][0]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._tick()
