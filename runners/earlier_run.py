"""An earlier run's files, set aside while a new ``runners.train`` run in the same folder
has not yet made the folder its own.

A new run in a used folder moves the earlier run's files into ``RUN/.earlier_run/``
(:func:`set_aside`). The folder becomes the new run's at its first checkpoint or its
``result.json``: then the set-aside files go (:func:`discard`). A command refused, failed or
stopped before that puts them back (:func:`put_back`); one that could not (``kill -9``, a
power cut) leaves them, and the next ``runners.train`` command in the folder puts them back
first. So ``.earlier_run/`` existing means exactly "the stopped command never owned the
folder" (until 3 Dec 2026 that was guessed from a checkpoint or ``result.json`` in the
folder, which another runner, a copy by hand or a set-aside interrupted half-way could put
there: the earlier run was then deleted unread).

``.earlier_run/.manifest.json`` names the files moved and those left in place (the new run's
inputs) before anything moves, so a put-back interrupted half-way can be done again: a file
named moved whose copy is no longer in ``.earlier_run/`` is already back. ``.hydra_copy/``
holds the earlier run's ``.hydra/`` files as they were before hydra rewrote them for the new
command (:mod:`runners.folder_lock` keeps them in memory), so that the command after a kill
can give them back too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The folder of a run folder where a new run keeps the earlier run's files.
EARLIER_RUN = ".earlier_run"
#: ``.earlier_run/`` renamed before it is removed (a rename is atomic, a removal is not).
DISCARD = ".earlier_run.discard"
MANIFEST = ".manifest.json"
HYDRA_COPY = ".hydra_copy"
#: Run folders (real paths) whose earlier run a failed or stopped command of this process
#: put back: its Ctrl-C message then offers no ``resume=``, which would continue the
#: earlier run (fuzzing, 3 Dec 2026).
GIVEN_BACK: set[str] = set()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def check(run_dir: Path) -> None:
    """One clear error for a ``.earlier_run`` that is no folder (a file, a symlink): every
    command in the folder failed with a ``FileExistsError`` or ``OSError`` traceback."""
    aside = run_dir / EARLIER_RUN
    if aside.is_symlink() or (aside.exists() and not aside.is_dir()):
        kind = "a symlink" if aside.is_symlink() else "a file"
        raise ValueError(
            f"{aside} is {kind}, not the folder runners.train keeps an earlier run's files in; "
            "move it away or remove it"
        )


def set_aside(
    run_dir: Path, files: Sequence[str], dirs: Sequence[str], kept: set[str]
) -> list[str]:
    """Move ``files`` and ``dirs`` of ``run_dir`` (except the names in ``kept``) into
    ``run_dir/.earlier_run/``, the manifest written first; the names moved."""
    from runners import folder_lock

    check(run_dir)
    aside = run_dir / EARLIER_RUN
    if aside.is_dir():  # a put-back that could not finish: never a run's files to lose here
        raise ValueError(f"{aside} is still there; runners.train puts it back first")
    discard(run_dir)  # a removal that could not finish
    moving = [
        n
        for n in (*files, *dirs)
        if n not in kept and ((run_dir / n).is_file() if n in files else (run_dir / n).is_dir())
    ]
    hydra = folder_lock.hydra_snapshot(run_dir)
    tmp = run_dir / f"{EARLIER_RUN}.new"
    _remove(tmp)
    tmp.mkdir()
    manifest = {"moved": moving, "kept": sorted(kept), "hydra": hydra and hydra[0]}
    (tmp / MANIFEST).write_text(json.dumps(manifest))
    if hydra is not None:
        for rel, data in hydra[1].items():
            (tmp / HYDRA_COPY / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / HYDRA_COPY / rel).write_bytes(data)
    tmp.replace(aside)  # the manifest is there before anything moves
    try:
        for name in moving:
            (run_dir / name).replace(aside / name)
    except OSError as exc:  # an immutable file, a full disk: back as it was, one line
        put_back(run_dir, files, dirs)
        raise ValueError(
            f"{run_dir}: cannot set the earlier run's files aside in {EARLIER_RUN}/ "
            f"({exc.strerror or exc}: {exc.filename}); they are left in place"
        ) from None
    return moving


def hint(path: Path) -> str:
    """`` (set aside as ...)`` when a missing ``path`` in a run folder is in that folder's
    ``.earlier_run/``, else ``""``: for the "no such file" of a policy or plan file."""
    aside = path.parent / EARLIER_RUN / path.name
    if not aside.is_file():
        return ""
    return (
        f" (a runners.train command stopped before its first checkpoint, kill -9?, set it "
        f"aside as {aside}; the next runners.train command in {path.parent} puts it back)"
    )


def _manifest(aside: Path, names: Sequence[str]) -> dict[str, Any] | None:
    """The manifest, checked; ``None`` when it is missing or not one (hand-edited: then
    only the files with a copy in ``.earlier_run/`` are put back, nothing else removed)."""
    try:
        m = json.loads((aside / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict):
        return None
    moved, kept, hydra = m.get("moved"), m.get("kept"), m.get("hydra")
    ok = all(isinstance(v, list) and all(n in names for n in v) for v in (moved, kept))
    # hydra's output subdir: one plain name inside the run folder (an edited "." or an
    # absolute path had that folder removed; fuzzing, 3 Dec 2026)
    plain = isinstance(hydra, str) and Path(hydra).name == hydra and hydra not in ("", ".", "..")
    if not ok or not (hydra is None or plain):
        return None
    return {"moved": list(moved), "kept": set(kept), "hydra": hydra}


def put_back(
    run_dir: Path, files: Sequence[str], dirs: Sequence[str], *, hydra_now: bool = False
) -> list[str]:
    """Give ``run_dir`` back the earlier run's files from ``.earlier_run/`` and remove the
    files the new command wrote in their place; the names put back ([] when there is no
    ``.earlier_run/``). Safe to do again after an interruption. The earlier run's
    ``.hydra/`` (as it was before the stopped command's hydra rewrote it) is written back
    with ``hydra_now`` (this command writes none of its own: ``resume=``), else kept to give
    back if this command fails (:func:`runners.folder_lock.put_back_hydra`)."""
    from runners import folder_lock

    check(run_dir)
    aside = run_dir / EARLIER_RUN
    if not aside.is_dir():
        discard(run_dir)
        return []
    names = (*files, *dirs)
    m = _manifest(aside, names)
    # every name with a copy there comes back, whatever the manifest says (an edited one
    # left result.json out, and it was removed with .earlier_run/; fuzzing, 3 Dec 2026)
    there = [n for n in names if (aside / n).exists() or (aside / n).is_symlink()]
    moved = list(dict.fromkeys([*(m["moved"] if m else []), *there]))
    back = []
    try:
        for name in moved:
            src = aside / name
            if src.exists() or src.is_symlink():
                _remove(run_dir / name)
                src.replace(run_dir / name)
                back.append(name)
        if m is not None:  # the new command's files that the earlier run did not have
            for name in names:
                if name not in moved and name not in m["kept"]:
                    _remove(run_dir / name)
    except OSError as exc:
        raise ValueError(
            f"{run_dir}: cannot put the earlier run's files back from {EARLIER_RUN}/ "
            f"({exc.strerror or exc}: {exc.filename}); they stay there until a runners.train "
            "command in the folder can"
        ) from None
    copy = aside / HYDRA_COPY
    if m is not None and m["hydra"] and copy.is_dir():
        snap = {str(p.relative_to(copy)): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
        folder_lock.replace_hydra_snapshot(run_dir, m["hydra"], snap)
        if hydra_now:  # a resume= writes no .hydra/ of its own: the earlier run's, now
            folder_lock.put_back_hydra(run_dir)
    discard(run_dir)
    return back


def discard(run_dir: Path) -> None:
    """Remove ``.earlier_run/`` (renamed first, so that a removal cut short leaves no
    half of it to be put back) and what an earlier removal left."""
    aside = run_dir / EARLIER_RUN
    if aside.is_dir() and not aside.is_symlink():
        _remove(run_dir / DISCARD)
        aside.replace(run_dir / DISCARD)
    for leftover in (DISCARD, f"{EARLIER_RUN}.new"):
        _remove(run_dir / leftover)
