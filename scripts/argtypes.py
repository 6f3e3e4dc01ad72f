"""argparse ``type=`` callables shared by the benchmark scripts: a bad number or list is
argparse's one-line ``error:`` (exit status 2) before any work, not a traceback or a
meaningless table (``--steps 0`` divided by zero, ``--seconds inf`` never ended,
``--seconds -5`` timed three evaluations)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def int_list(text: str) -> list[int]:
    """Comma-separated integers >= 0, e.g. ``0,1,2``."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 0 (e.g. 0,1), got {text!r}"
        )
    return [int(p) for p in parts]


def image_path(text: str) -> Path:
    """A ``.png`` / ``.pdf`` / ``.svg`` file whose folder exists or can be made (``--out DIR``
    wrote ``DIR.png`` beside it; a file in the way failed after the work)."""
    p = Path(text)
    if p.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise argparse.ArgumentTypeError(f"expected a .png, .pdf or .svg file, got {text!r}")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file name")
    existing = next((q for q in (p.parent, *p.parent.parents) if q.exists()), None)
    if existing is None or not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a folder")
    return p
