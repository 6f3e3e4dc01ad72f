"""Launch a plan over several hosts: one ``torchrun --nnodes N --rdzv-backend c10d`` per host (here: several on localhost)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime import launch
from runtime.dist import free_port
from runtime.execute import ExecResult
from runtime.launch import RankFailure, kill_tree, read_error_files, run_folder
from runtime.spec import RunSpec


def node_command(
    spec_path: str | Path,
    out_dir: str | Path,
    *,
    nnodes: int,
    nproc_per_node: int,
    rdzv_endpoint: str,
    rdzv_id: str,
    python: str = sys.executable,
) -> list[str]:
    """The command each host runs: ``torchrun --nnodes N --nproc-per-node K --rdzv-backend
    c10d --rdzv-endpoint HOST:PORT --rdzv-id ID -m runtime.worker --spec S --out DIR``.

    Every host runs the same command (same spec file contents, same endpoint and id);
    the c10d rendezvous numbers the hosts in order of arrival and gives global ranks
    ``node_rank * K + local_rank``. ``HOST`` is one of the hosts (it serves the store).
    ``--max-restarts=0``: a failed rank ends the job on every host.
    """
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}",
        "--max-restarts=0", "--monitor-interval=0.1",
        "-m", "runtime.worker", "--spec", str(spec_path), "--out", str(out_dir),
    ]  # fmt: skip


def run_specs_multinode(
    specs: Sequence[RunSpec],
    nnodes: int,
    *,
    timeout_s: float = 600.0,
    out_dir: str | Path | None = None,
    rdzv_endpoint: str | None = None,
) -> list[ExecResult]:
    """Run ``specs`` (one world size) as ``nnodes`` torchrun launches on this machine, each
    a "host" of ``world_size / nnodes`` ranks joined by a c10d rendezvous -- the launch a
    cluster runs with one :func:`node_command` per host, tested on localhost.

    Each host keeps its files in ``out_dir/node{k}``. If any rank fails, every launch
    ends (its torchrun stops its ranks when theirs lose their peers) and
    :class:`RankFailure` names the rank from the error records of all hosts; a job past
    ``timeout_s`` is killed on every host.
    """
    if not specs:
        return []
    for s in specs:
        s.validate()
    world = specs[0].world_size
    if any(s.world_size != world for s in specs):
        raise ValueError("run_specs_multinode: every spec needs the same world size")
    if nnodes < 1 or world % nnodes:
        raise ValueError(
            f"run_specs_multinode: world size {world} does not split into {nnodes} hosts"
        )
    endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
    rdzv_id = f"devplace-{uuid.uuid4().hex[:8]}"
    with run_folder("devplace_nodes_") as tmp:
        root = Path(out_dir) if out_dir else Path(tmp)
        text = json.dumps([json.loads(s.to_json()) for s in specs])
        env = dict(os.environ)
        pkg = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("OMP_NUM_THREADS", str(specs[0].threads))
        # torchrun's --log-dir: without one, each host leaves a $TMPDIR/torchelastic_* folder
        env.setdefault("PET_LOG_DIR", str(Path(tmp) / "torchelastic"))
        folders, procs, logs = [], [], []
        try:
            for k in range(nnodes):
                folder = root / f"node{k}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "spec.json").write_text(text)
                cmd = node_command(
                    folder / "spec.json", folder, nnodes=nnodes,
                    nproc_per_node=world // nnodes, rdzv_endpoint=endpoint, rdzv_id=rdzv_id,
                )  # fmt: skip
                (folder / "command.txt").write_text(shlex.join(cmd) + "\n")
                log = open(folder / "torchrun.log", "w")  # noqa: SIM115 - closed in finally
                logs.append(log)
                procs.append(
                    subprocess.Popen(
                        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
                folders.append(folder)
            codes = _wait_all(procs, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:  # torchrun and its workers (sessions of their own)
                    kill_tree(p.pid)
                    p.wait()
            for log in logs:
                log.close()
        if any(c != 0 for c in codes):
            raise _failure(folders, codes, timeout_s)
        per_rank: dict[int, Any] = {}
        for f in folders:
            for p in f.glob("rank*.json"):
                rec = json.loads(p.read_text())
                per_rank[int(rec["records"][0]["rank"])] = rec
        missing = sorted(set(range(world)) - set(per_rank))
        if missing:
            raise RankFailure(missing[0], "exit", f"ranks {missing} wrote no record", "", codes)
        results = [
            ExecResult.from_ranks(spec, [per_rank[r]["records"][i] for r in range(world)])
            for i, spec in enumerate(specs)
        ]
        if out_dir:
            Path(root, "results.json").write_text(json.dumps([r.to_dict() for r in results]))
        return results


def _failure(folders: list[Path], codes: list[int | None], timeout_s: float) -> RankFailure:
    """The failure of a multi-host job from every host's error records (and, where
    ``runtime.launch`` can read them, every host's torchrun failure summary): root causes
    before symptoms of a lost peer, earliest first -- the attribution of a one-host job."""
    records = [rec for f in folders for rec in read_error_files(f)]
    first_failure = getattr(launch, "first_failure", None)
    summaries = getattr(launch, "torchrun_failures", None)
    if first_failure is not None and summaries is not None:
        exits: dict[int, tuple[int, float]] = {}
        for f in folders:
            exits.update(summaries(_tail(f / "torchrun.log", 10**7)))
        found = first_failure(records, exits, codes)
        if found is not None:
            return found
    records.sort(
        key=lambda r: (launch.is_peer_symptom(str(r.get("message", ""))), r.get("time", 0.0))
    )
    if records:
        e = records[0]
        return RankFailure(e["rank"], e["type"], e["message"], e["traceback"], codes)
    if None in codes:
        return RankFailure(
            -1, "timeout", f"multi-host job did not finish within {timeout_s} s", "", codes
        )
    tails = "\n".join(f"--- node{k}\n" + _tail(f / "torchrun.log") for k, f in enumerate(folders))
    return RankFailure(-1, "exit", f"torchrun exited with {codes}:\n{tails}", "", codes)


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text()[-n:]
    except OSError:
        return ""


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """Wait for every launch; once one fails, give the others 30 s to notice (their ranks
    lose their peers), then kill them. ``None`` = killed at the deadline."""
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        now = time.monotonic()
        if now > deadline or (failed_at is not None and now - failed_at > 30.0):
            for p in procs:
                if p.poll() is None:
                    kill_tree(p.pid)
            return [p.wait() if c is not None else None for p, c in zip(procs, codes)]
        time.sleep(0.1)
