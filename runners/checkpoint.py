"""Atomic training checkpoints and exact resume for SB3 runs (model, envs, RNGs, callbacks).

A checkpoint is one file, ``RUN_DIR/checkpoint.pkl``, replaced atomically (temp file +
``os.replace``), taken between PPO updates. It holds everything the rest of the run
depends on: the SB3 model (policy, optimizer, step counters, last observation), the
vectorised environments mid-episode (their RNGs and oracle state), the global python /
numpy / torch RNG states and the callbacks' state. Resuming from it therefore replays
the remaining updates exactly as an uninterrupted run with the same seed would.

Checkpoints are pickles, like SB3's own model zips: load only files you wrote yourself.
"""

from __future__ import annotations

import io
import pickle
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runners.common import write_bytes_atomic

CHECKPOINT = "checkpoint.pkl"
VERSION = 1

#: Callback attributes that point at the live run rather than hold its state.
_LIVE_ATTRS = frozenset(
    {"model", "training_env", "locals", "globals", "logger", "parent", "callback", "on_improve"}
)


def rng_state() -> dict[str, Any]:
    """The global python, numpy and torch RNG states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - SB3 uses the global RNG
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])


def callback_state(cb: Any) -> dict[str, Any]:
    """The picklable state of an SB3 callback: its attributes minus references to the live
    run (the model, envs, loggers and the names in the callback's ``live_attrs``)."""
    live = _LIVE_ATTRS | set(getattr(cb, "live_attrs", ()))
    return {k: v for k, v in vars(cb).items() if k not in live}


def save(
    run_dir: Path,
    model: Any,
    *,
    callbacks: Sequence[Any] = (),
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``RUN_DIR/checkpoint.pkl`` atomically; return its path."""
    buf = io.BytesIO()
    model.save(buf)
    state = {
        "version": VERSION,
        "algo": type(model),
        "model": buf.getvalue(),
        "env": model.get_env(),
        "rng": rng_state(),
        "callbacks": [callback_state(cb) for cb in callbacks],
        "extra": dict(extra or {}),
    }
    path = Path(run_dir) / CHECKPOINT
    write_bytes_atomic(path, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    return path


def exists(run_dir: str | Path) -> bool:
    return (Path(run_dir) / CHECKPOINT).exists()


def load(run_dir: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save` (``ValueError`` if absent or foreign)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        raise ValueError(f"resume: {path} does not exist; was the run checkpointed?")
    with open(path, "rb") as f:
        state = pickle.load(f)  # noqa: S301 - our own file, see the module docstring
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"resume: {path} is not a devplace checkpoint of version {VERSION}")
    return state


def restore(state: Mapping[str, Any], callbacks: Sequence[Any] = ()) -> Any:
    """Rebuild the model on its saved envs, then restore RNGs and callback state."""
    algo = state["algo"]
    model = algo.load(io.BytesIO(state["model"]), env=state["env"], device="cpu", force_reset=False)
    for cb, cb_state in zip(callbacks, state["callbacks"], strict=False):
        vars(cb).update(cb_state)
    # load() reseeds the global generators; put back the ones of the killed run.
    set_rng_state(state["rng"])
    return model
