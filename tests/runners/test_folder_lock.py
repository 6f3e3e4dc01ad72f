"""runners.folder_lock: one runner at a time writes a run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runners import common, folder_lock
from tests.runners.conftest import ROOT, small_env


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_a_held_folder_names_its_holder_and_is_free_after(tmp_path: Path) -> None:
    assert folder_lock.holder(tmp_path) is None  # no lock file: free, and none is made
    assert not (tmp_path / folder_lock.LOCK_FILE).exists()
    with folder_lock.held(tmp_path, "train"):
        who = folder_lock.holder(tmp_path)
        assert who is not None
        assert who.startswith(f"runners.train (pid {os.getpid()} on ")
        with pytest.raises(folder_lock.FolderInUse, match=r"is in use by runners\.train \(pid"):
            folder_lock.check_free(tmp_path)
        with pytest.raises(folder_lock.FolderInUse, match="give another output_dir"):
            with folder_lock.held(tmp_path, "plan"):
                pass  # pragma: no cover - refused above
        assert folder_lock.holder(tmp_path) == who  # the refused runner did not overwrite it
    assert folder_lock.holder(tmp_path) is None
    folder_lock.check_free(tmp_path)
    with folder_lock.held(tmp_path, "plan"):  # and it can be taken again
        assert folder_lock.holder(tmp_path).startswith("runners.plan (pid")


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from runners import folder_lock\n"
        f"with folder_lock.held({str(tmp_path)!r}, 'train'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        assert f"pid {proc.pid} " in folder_lock.holder(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while folder_lock.holder(tmp_path) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert folder_lock.holder(tmp_path) is None


def test_reported_errors_refuses_a_held_folder_and_writes_nothing_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock taken by the runner itself (a second runner that started between the
    command-line check and the first one's lock is stopped here)."""
    with folder_lock.held(tmp_path, "train"):
        before = _files(tmp_path)
        ran = []
        with pytest.raises(SystemExit) as exc:
            with common.reported_errors(tmp_path, "plan"):
                ran.append(1)  # pragma: no cover - refused above
        assert exc.value.code == 2 and not ran
        assert _files(tmp_path) == before  # no error.txt, no plan.log
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} is in use by runners.train (pid {os.getpid()} ")
    with common.reported_errors(tmp_path, "plan"):  # free again: the body runs
        ran.append(1)
    assert ran == [1]


@pytest.mark.timeout(300)
def test_a_second_command_on_a_folder_in_use_is_refused_and_the_first_run_kept(
    graph_file: Path, tmp_path: Path
) -> None:
    """Two commands with one output_dir wrote the same result.json, logs and checkpoints in
    turn (noticed 2 Dec 2026); a resume= of a run still going did the same."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    train = [sys.executable, "-m", "runners.train"]
    new_run = [*train, *small_env(graph_file), "env.baselines=[]", f"output_dir={run_dir}"]

    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )

    first = run([*new_run, "agent=expert"])
    assert first.returncode == 0, first.stderr[-2000:]
    with folder_lock.held(run_dir, "train"):  # stands for the first run, still going
        before = _files(run_dir)
        for cmd in ([*new_run, "agent=round_robin"], [*train, f"resume={run_dir}"]):
            p = run(cmd)
            assert p.returncode == 2, p.stderr[-2000:]
            assert p.stderr.startswith(f"error: {run_dir} is in use by runners.train (pid ")
            assert p.stderr.count("\n") == 1  # one line
            assert _files(run_dir) == before  # not a file written or replaced
    again = run([*new_run, "agent=round_robin"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert folder_lock.holder(run_dir) is None  # released when the run ended
