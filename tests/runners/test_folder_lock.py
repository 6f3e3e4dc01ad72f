"""runners.folder_lock: one runner at a time writes a run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runners import common, folder_lock
from tests.runners.conftest import ROOT, run_cli_module, small_env


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@contextmanager
def _held_elsewhere(folder: Path, app: str = "train") -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``folder``'s lock for the block (a lock this process holds
    is its own: taking it again is a no-op)."""
    folder.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys\n"
        "from runners import folder_lock\n"
        f"with folder_lock.held({str(folder)!r}, {app!r}):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_held_folder_names_its_holder_and_is_free_after(tmp_path: Path) -> None:
    assert folder_lock.holder(tmp_path) is None  # no lock file: free, and none is made
    assert not (tmp_path / folder_lock.LOCK_FILE).exists()
    with _held_elsewhere(tmp_path) as other:
        who = folder_lock.holder(tmp_path)
        assert who is not None
        assert who.startswith(f"runners.train (pid {other.pid} on ")
        with pytest.raises(folder_lock.FolderInUse, match=r"is in use by runners\.train \(pid"):
            folder_lock.check_free(tmp_path)
        with pytest.raises(folder_lock.FolderInUse, match="give another output_dir"):
            with folder_lock.held(tmp_path, "plan"):
                pass  # pragma: no cover - refused above
        assert folder_lock.holder(tmp_path) == who  # the refused runner did not overwrite it
    assert folder_lock.holder(tmp_path) is None
    folder_lock.check_free(tmp_path)
    with folder_lock.held(tmp_path, "plan"):  # and it can be taken again
        assert folder_lock.holder(tmp_path).startswith(f"runners.plan (pid {os.getpid()} ")
        with folder_lock.held(tmp_path, "plan"):  # held by this process already: kept
            pass
        assert folder_lock.holder(tmp_path) is not None
    assert folder_lock.holder(tmp_path) is None


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    with _held_elsewhere(tmp_path) as other:
        assert f"pid {other.pid} " in folder_lock.holder(tmp_path)
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=30)
        deadline = time.monotonic() + 10
        while folder_lock.holder(tmp_path) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert folder_lock.holder(tmp_path) is None


def test_reported_errors_refuses_a_held_folder_and_writes_nothing_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock taken by the runner itself (for a job of a sweep, which hydra starts
    without the run callback, or a runner called without hydra)."""
    with _held_elsewhere(tmp_path) as other:
        before = _files(tmp_path)
        ran = []
        with pytest.raises(SystemExit) as exc:
            with common.reported_errors(tmp_path, "plan"):
                ran.append(1)  # pragma: no cover - refused above
        assert exc.value.code == 2 and not ran
        assert _files(tmp_path) == before  # no error.txt, no plan.log
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} is in use by runners.train (pid {other.pid} ")
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
    env["LOCK_TEST_DIR"] = str(tmp_path)
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
        quoted = [a for a in new_run if not a.startswith("output_dir=")]
        for cmd in (
            [*new_run, "agent=round_robin"],
            [*train, f"resume={run_dir}"],
            # given quoted or by an interpolation, the folder was missed by a check of the
            # command line's text, and hydra rewrote the running run's .hydra/ (fuzzing)
            [*quoted, "agent=round_robin", f'output_dir="{run_dir}"'],
            [*quoted, "agent=round_robin", "output_dir=${oc.env:LOCK_TEST_DIR}/run"],
            [*quoted, "agent=round_robin", "hydra.run.dir=${oc.env:LOCK_TEST_DIR}/run"],
            # the lock went to hydra's folder, and the resume trained beside the run (fuzzing)
            [*train, f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'other'}"],
            [*train, "-m", f"resume={run_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        ):
            p = run(cmd)
            assert p.returncode == 2, p.stderr[-2000:]
            assert p.stderr.startswith(f"error: {run_dir} is in use by runners.train (pid "), cmd
            assert p.stderr.count("\n") == 1  # one line
            assert _files(run_dir) == before  # not a file written or replaced
    # the same sweep started twice: refused before it writes anything (it rewrote the
    # first one's jobs' .hydra/ files before each job was refused, fuzzing)
    sweep = tmp_path / "sw2"
    with _held_elsewhere(sweep):
        p = run([*train, "-m", *small_env(graph_file), "agent=expert,round_robin",
                 f"hydra.sweep.dir={sweep}"])  # fmt: skip
        assert p.returncode == 2 and p.stderr.startswith(f"error: {sweep} is in use by ")
        assert sorted(f.name for f in sweep.iterdir()) == [folder_lock.LOCK_FILE]
    again = run([*new_run, "agent=round_robin"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert folder_lock.holder(run_dir) is None  # released when the run ended


def test_a_lock_file_that_is_a_folder_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / folder_lock.LOCK_FILE).mkdir()
    with pytest.raises(ValueError, match=r"\.devplace\.lock is a folder, not devplace's lock"):
        with folder_lock.held(tmp_path, "train"):
            pass  # pragma: no cover - refused above
    code, _, err = run_cli_module("runners.plan", ["+env=gpt2_tiny_cpu4", "samples=4",
                                                   f"output_dir={tmp_path}"])  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "is a folder, not devplace's lock" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder_lock.LOCK_FILE]  # no .hydra


def test_another_users_lock_file_is_locked_read_only(tmp_path: Path, monkeypatch) -> None:
    """A lock file made by another user (0644) could not be opened for writing: a
    PermissionError traceback on every later run in a shared folder (fuzzing)."""
    (tmp_path / folder_lock.LOCK_FILE).write_text("runners.train (pid 1 on elsewhere)\n")
    real_open = os.open

    def open_as_other_user(path, flags, *args):
        if str(path).endswith(folder_lock.LOCK_FILE) and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_as_other_user)
    with folder_lock.held(tmp_path, "train"):
        assert folder_lock.holder(tmp_path) is not None  # locked, though not rewritten
        with pytest.raises(folder_lock.FolderInUse):
            folder_lock.check_free(tmp_path)
    assert folder_lock.holder(tmp_path) is None


def test_evaluate_holds_each_cell_while_it_trains(tmp_path: Path) -> None:
    """runners.evaluate trained a cell in a folder a runners.train was writing, exit 0, and
    replaced that run's config.yaml and result.json (fuzzing, 2 Dec 2026)."""
    from runners.evaluate import evaluate
    from tests.runners.conftest import compose

    cfg = compose(
        ["envs=[gpt2_tiny_cpu4]", "agents=[single,expert]", "seeds=[0]"], config="evaluate"
    )
    first = tmp_path / "ev" / "gpt2_tiny_cpu4" / "single" / "s0"
    cell = tmp_path / "ev" / "gpt2_tiny_cpu4" / "expert" / "s0"
    cell.mkdir(parents=True)
    (cell / "train.log").write_text("a run going on\n")
    with _held_elsewhere(cell):
        before = _files(cell)
        in_use = r"cell gpt2_tiny_cpu4 x expert x seed 0: .*expert/s0 is in use by runners\.train"
        with pytest.raises(ValueError, match=in_use):
            evaluate(cfg, tmp_path / "ev", echo=lambda s: None)
        assert _files(cell) == before
        assert not (first / "result.json").exists()  # refused before the first cell trained
        # and runs= naming that folder says it is still running
        runs = compose([f"runs=[{cell}]"], config="evaluate")
        with pytest.raises(ValueError, match=r"holds no result.json .*; it is still running: "):
            evaluate(runs, tmp_path / "cmp", echo=lambda s: None)
    evaluate(cfg, tmp_path / "ev", echo=lambda s: None)  # free: the cell trains
    assert (cell / "result.json").is_file()


def test_runs_named_by_the_clock_get_a_folder_of_their_own(
    graph_file: Path, tmp_path: Path
) -> None:
    """Runs started in one second with hydra's default folder (outputs/APP/DATE/TIME), e.g.
    seeds launched in the background by a shell loop, were all but the first refused (2 Dec
    2026): a run or sweep whose folder is named by the clock takes TIME_1, TIME_2, ... when
    TIME is held or holds an earlier run, and its jobs follow it. A folder the user names
    stays refused (the test above)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    env["LOCK_TEST_DIR"] = str(tmp_path)
    train = [sys.executable, "-m", "runners.train"]
    year = time.strftime("%Y")  # the clock's part of the folder names below

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*train, *args, *small_env(graph_file), "env.baselines=[]"]
        return subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )

    base = tmp_path / f"t{year}"
    (tmp_path / f"t{year}_1").mkdir()
    (tmp_path / f"t{year}_1" / "result.json").write_text("{}")  # an earlier run's folder
    with _held_elsewhere(base):
        p = run("agent=expert", "hydra.run.dir=${oc.env:LOCK_TEST_DIR}/t${now:%Y}")
        assert p.returncode == 0, p.stderr[-2000:]
        own = tmp_path / f"t{year}_2"
        assert p.stdout.rstrip().endswith(str(own))  # the summary line names its folder
        assert (own / "result.json").is_file() and (own / ".hydra" / "config.yaml").is_file()
        assert sorted(f.name for f in base.iterdir()) == [folder_lock.LOCK_FILE]
        assert (tmp_path / f"t{year}_1" / "result.json").read_text() == "{}"
    assert folder_lock.holder(own) is None  # released at the end
    sweep = tmp_path / f"s{year}"
    with _held_elsewhere(sweep):
        p = run(
            "-m", "agent=expert,round_robin", "hydra.sweep.dir=${oc.env:LOCK_TEST_DIR}/s${now:%Y}"
        )
        assert p.returncode == 0, p.stderr[-2000:]
        assert sorted(f.name for f in sweep.iterdir()) == [folder_lock.LOCK_FILE]
        jobs = tmp_path / f"s{year}_1"
        assert (jobs / "multirun.yaml").is_file()
        assert all((jobs / j / "result.json").is_file() for j in ("0", "1"))


def _hydra_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / ".hydra").iterdir())}


def test_a_refused_command_leaves_the_earlier_runs_hydra_files(
    graph_file: Path, tmp_path: Path
) -> None:
    """A command refused in a used folder rewrote the earlier run's .hydra/ (its
    overrides.yaml then named the refused command, not the one that made result.json);
    now they are put back. A command that succeeds, or a training run that fails after its
    first checkpoint (the folder is then its own), keeps its own."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    base = [sys.executable, "-m", "runners.train", *small_env(graph_file), "env.baselines=[]",
            f"output_dir={run_dir}"]  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )

    assert run("agent=expert").returncode == 0
    earlier = _hydra_files(run_dir)
    assert b"agent=expert" in earlier["overrides.yaml"]
    refused = run("agent=ideal_dp", "+agent.options.time_limit=-1")
    assert refused.returncode == 2 and "time_limit" in refused.stderr
    assert _hydra_files(run_dir) == earlier
    p = run("agent=round_robin")
    assert p.returncode == 0, p.stderr[-2000:]
    now = _hydra_files(run_dir)
    assert b"agent=round_robin" in now["overrides.yaml"]
    crashed = run("train.timesteps=256", "train.checkpoint_every=1", "agent.ppo.n_steps=64",
                  "train.crash_after_updates=1")  # fmt: skip
    assert crashed.returncode != 0
    assert b"crash_after_updates" in _hydra_files(run_dir)["overrides.yaml"]


def test_a_refused_sweep_job_leaves_the_earlier_jobs_hydra_files(
    graph_file: Path, tmp_path: Path
) -> None:
    """The same as above for the jobs of a sweep run again into its folder
    (hydra.sweep.dir=FIXED): hydra rewrote a job's .hydra/ before the job was refused."""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    base = [sys.executable, "-m", "runners.train", "-m", *small_env(graph_file),
            "env.baselines=[]", f"hydra.sweep.dir={sweep}"]  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )

    first = run("agent=expert,single")
    assert first.returncode == 0, first.stderr[-2000:]
    earlier = {job: _hydra_files(sweep / job) for job in ("0", "1")}
    assert b"agent=expert" in earlier["0"]["overrides.yaml"]
    refused = run("agent=ideal_dp", "+agent.options.time_limit=-1")
    assert refused.returncode != 0 and "time_limit" in refused.stderr
    assert (sweep / "0" / "result.json").is_file()
    assert {job: _hydra_files(sweep / job) for job in ("0", "1")} == earlier
