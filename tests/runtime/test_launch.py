"""The launcher: one rank raises, every rank exits with that rank's error in bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.launch import RankFailure, first_failure, spawn, torchrun_failures, with_silent_exits
from tests.runtime import _workers

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def test_one_of_four_ranks_raises_all_exit_with_its_error():
    """Rank 2 raises while ranks 0, 1, 3 block in an all-reduce it never joins."""
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(_workers.raise_on_rank, 4, (2,), timeout_s=60, grace_s=1.0)
    elapsed = time.monotonic() - t0
    err = info.value
    assert (err.rank, err.error_type) == (2, "ValueError")
    assert "boom on rank 2" in str(err) and "raise_on_rank" in err.remote_traceback
    assert len(err.exit_codes) == 4
    assert all(c is not None and c != 0 for c in err.exit_codes)  # blocked ranks killed too
    assert elapsed < 50  # far below the 300 s process-group timeout the others would wait


def test_ranks_see_the_launchers_environment_as_it_is_now(monkeypatch):
    """Ranks fork from a fork server started with the environment of its first use; each
    must still see the launcher's environment at launch time (variables set, changed and
    removed since), plus the rank variables, with torch and the runtime already loaded."""
    monkeypatch.setenv("DEVPLACE_PROBE", "first")
    monkeypatch.setenv("DEVPLACE_GONE", "here")
    names = ["DEVPLACE_PROBE", "DEVPLACE_GONE", "DEVPLACE_EXTRA", "RANK", "WORLD_SIZE"]
    spawn(_workers.environment, 1, (names,), timeout_s=60)  # the fork server is running now
    monkeypatch.setenv("DEVPLACE_PROBE", "second")
    monkeypatch.delenv("DEVPLACE_GONE")
    got = spawn(_workers.environment, 2, (names,), timeout_s=60, env={"DEVPLACE_EXTRA": "x"})
    for r, seen in enumerate(got):
        assert seen["env"] == {
            "DEVPLACE_PROBE": "second", "DEVPLACE_GONE": None, "DEVPLACE_EXTRA": "x",
            "RANK": str(r), "WORLD_SIZE": "2",
        }  # fmt: skip


def test_ranks_fork_from_a_server_that_imported_torch_and_the_runtime():
    """In a fresh process (in this one another test's SubprocVecEnv may have started the
    fork server first, without the preload): the ranks find runtime.worker imported."""
    code = (
        "import json; from runtime.launch import spawn; from tests.runtime import _workers; "
        "print(json.dumps(spawn(_workers.environment, 2, (['RANK'],), timeout_s=120)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert [g["env"]["RANK"] for g in got] == ["0", "1"]
    assert all(g["sys_modules_has_runtime_worker"] for g in got)


def test_start_method_can_be_forced_and_is_checked(monkeypatch):
    from runtime.launch import rank_context

    monkeypatch.setenv("DEVPLACE_START_METHOD", "spawn")
    assert rank_context().get_start_method() == "spawn"
    (seen,) = spawn(_workers.environment, 1, (["RANK"],), timeout_s=120)
    assert seen["env"] == {"RANK": "0"} and not seen["sys_modules_has_runtime_worker"]
    monkeypatch.setenv("DEVPLACE_START_METHOD", "fork")
    with pytest.raises(ValueError, match="DEVPLACE_START_METHOD='fork': expected 'forkserver'"):
        spawn(_workers.environment, 1, (["RANK"],))
    monkeypatch.delenv("DEVPLACE_START_METHOD")
    assert rank_context().get_start_method() == "forkserver"


def test_spawn_rejects_zero_ranks():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        spawn(_workers.raise_on_rank, 0, (0,))


@pytest.mark.parametrize(
    ("how", "error_type", "says"),
    [("kill", "signal", "killed by signal 9 (SIGKILL)"), ("leave", "left_early", "left early")],
)
def test_the_rank_that_died_first_is_blamed_not_its_peers(how, error_type, says):
    """Rank 1 is SIGKILLed (writes no error file) or returns early; ranks 0, 2, 3 then only
    see a closed connection. The failure names rank 1 and how it ended."""
    with pytest.raises(RankFailure) as info:
        spawn(_workers.die_on_rank, 4, (1, how), timeout_s=60, grace_s=1.0)
    err = info.value
    assert (err.rank, err.error_type) == (1, error_type), str(err)
    assert says in str(err)
    # a rank that returned may still be exiting when the launcher stops the job (SIGTERM)
    assert err.exit_codes[1] in ((-9,) if how == "kill" else (0, -15)), err.exit_codes


def test_first_failure_order():
    sym = "Connection closed by peer [127.0.0.1]:1234"

    def rec(r: int, m: str, t: float) -> dict:
        return {"rank": r, "type": "RuntimeError", "message": m, "traceback": "", "time": t}

    # a root-cause error wins over an earlier symptom and over a silent death
    f = first_failure([rec(0, sym, 1.0), rec(3, "bad shape", 2.0)], {2: (-9, 0.5)})
    assert (f.rank, f.error_type) == (3, "RuntimeError")
    # only symptoms: the rank killed by a signal, even when a peer exited 0 before it
    f = first_failure(
        [rec(0, sym, 1.0)], {2: (-9, 0.9), 3: (0, 0.1), 0: (1, 1.1)}, [1, None, -9, 0]
    )
    assert (f.rank, f.error_type) == (2, "signal")
    assert "rank 2 was killed by signal 9 (SIGKILL); ranks [0] then lost" in str(f)
    assert f.exit_codes == [1, None, -9, 0]
    # only symptoms and an exit 0: that rank left early
    f = first_failure([rec(0, sym, 1.0)], {3: (0, 0.1), 0: (1, 1.1)})
    assert (f.rank, f.error_type) == (3, "left_early")
    # a non-zero exit without a record
    assert (
        first_failure([], {1: (3, 0.2)}).message
        == "rank 1 exited with code 3 without reporting an error"
    )
    # nothing to go on but symptoms: the earliest one
    assert first_failure([rec(2, sym, 2.0), rec(1, sym, 1.0)], {}).rank == 1
    assert first_failure([], {0: (0, 1.0)}) is None


def test_torchrun_failures_parses_the_summary():
    log = """
Failures:
[1]:
  time      : 2026-01-02_03:04:06
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 11)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-02_03:04:05
  host      : box
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 13)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 13
"""
    got = torchrun_failures(log)
    assert {r: c for r, (c, _) in got.items()} == {0: 1, 2: -9}
    assert got[2][1] < got[0][1]


def test_torchrun_root_cause_wins_a_tie_in_whole_seconds():
    """Seen in CI: rank 1 was SIGKILLed and torchrun SIGTERMed rank 0 in the same second;
    the summary lists rank 0 first. Its "Root Cause" section names rank 1."""
    entry = """[{i}]:
  time      : 2026-11-26_09:40:12
  host      : box
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 2225{rank})
  error_file: <N/A>
  traceback : Signal {sig} received by PID 2225{rank}
"""
    log = (
        "Failures:\n" + entry.format(i=1, rank=0, code=-15, sig="15 (SIGTERM)")
        + entry.format(i=2, rank=2, code=-15, sig="15 (SIGTERM)")
        + "------\nRoot Cause (first observed failure):\n"
        + entry.format(i=0, rank=1, code=-9, sig="9 (SIGKILL)")
    )  # fmt: skip
    got = torchrun_failures(log)
    assert {r: c for r, (c, _) in got.items()} == {0: -15, 1: -9, 2: -15}
    assert got[1][1] < got[0][1] == got[2][1]
    f = first_failure([], got)
    assert (f.rank, f.error_type) == (1, "signal"), str(f)
    # without the summary's help: a SIGTERM is the launcher's, any other death comes first
    assert first_failure([], {0: (-15, 5.0), 1: (-9, 5.0)}).rank == 1
    assert first_failure([], {0: (-15, 4.0), 2: (1, 5.0)}).rank == 2
    assert first_failure([], {0: (-15, 4.0)}).rank == 0
    # rank 1 returned early (no trace: exit 0), rank 0 failed on its closed connection and
    # torchrun stopped rank 2 before it wrote its record: rank 1 left early, not rank 2
    sym = {"rank": 0, "type": "RuntimeError", "message": "Connection closed by peer", "time": 3.0}
    f = first_failure([{**sym, "traceback": ""}], {1: (0, 0.0), 2: (-15, 5.0), 0: (1, 3.0)})
    assert (f.rank, f.error_type) == (1, "left_early"), str(f)


@pytest.mark.parametrize(
    "how,error_type,says",
    [("kill", "signal", "killed by signal 9 (SIGKILL)"), ("exit", "left_early", "left early")],
)
def test_torchrun_rank_that_died_or_left_is_blamed(tmp_path, how, error_type, says):
    """Under torchrun: rank 1 of 3 is SIGKILLed or returns early (exit 0, which torchrun
    does not list as a failure); the peers' 'connection closed' records, torchrun's summary
    and the missing result records lead to rank 1, as runtime.execute reads them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from runtime.launch import read_error_files

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
           "--monitor-interval=0.1", "-m", "tests.runtime._workers", str(tmp_path), "1", how]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=80, cwd=root)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    records = read_error_files(tmp_path)
    f = first_failure(records, with_silent_exits(torchrun_failures(log), 3, records, set()))
    assert f is not None and (f.rank, f.error_type) == (1, error_type), (str(f), log[-2000:])
    assert says in str(f)


def test_a_failure_of_no_one_rank_is_the_jobs() -> None:
    """A timeout has no failing rank (rank -1): the message said "rank -1 failed" (fuzzing)."""
    from runtime.launch import RankFailure

    assert str(RankFailure(-1, "timeout", "job did not finish within 0.5 s")) == (
        "the job failed with timeout: job did not finish within 0.5 s"
    )
    assert str(RankFailure(2, "ValueError", "bad")) == "rank 2 failed with ValueError: bad"


# ------------------------------------------------------------------ run folders
def test_a_killed_runs_folder_is_swept_by_the_next_run(tmp_path):
    import os
    import signal

    from runtime.launch import OWNER_FILE, _host_id, sweep_stale_run_folders

    # a run holding its folder is SIGKILLed: TemporaryDirectory's cleanup never runs
    code = (
        "import time\nfrom runtime.launch import run_folder\n"
        "with run_folder('devplace_exec_') as t:\n    print(t, flush=True)\n    time.sleep(120)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    killed = Path(proc.stdout.readline().strip())
    here = _host_id()
    assert killed.parent == tmp_path
    assert (killed / OWNER_FILE).read_text() == f"{proc.pid} {here}"
    assert sweep_stale_run_folders(tmp_path) == []  # its owner is alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert killed.is_dir()
    # kept besides: this process's own folder, one without an owner file, one whose owner
    # file is not a pid, one whose dead owner ran on another host (or pid namespace: its
    # pid means nothing here), and a folder of another name whose owner is dead
    kept = {}
    for name, owner in [
        ("devplace_spawn_mine", f"{os.getpid()} {here}"),
        ("devplace_exec_noowner", None),
        ("devplace_exec_junk", "not a pid"),
        ("devplace_exec_elsewhere", f"{proc.pid} otherhost|pid:[1]"),
        ("someone_else", f"{proc.pid} {here}"),
    ]:
        kept[name] = tmp_path / name
        kept[name].mkdir()
        if owner is not None:
            (kept[name] / OWNER_FILE).write_text(owner)
    assert sweep_stale_run_folders(tmp_path) == [killed]
    assert not killed.exists()
    assert all(d.is_dir() for d in kept.values())


def test_run_folder_records_its_owner_and_cleans_up(tmp_path, monkeypatch):
    import os
    import tempfile

    from runtime.launch import OWNER_FILE, _host_id, run_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / "devplace_nodes_old"
    stale.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (stale / OWNER_FILE).write_text(f"{dead.pid} {_host_id()}")
    with run_folder("devplace_exec_") as t:
        assert Path(t).parent == tmp_path
        assert (Path(t) / OWNER_FILE).read_text() == f"{os.getpid()} {_host_id()}"
        assert not stale.exists()  # swept on the way in
    assert not Path(t).exists()
    with pytest.raises(ValueError, match="must start with 'devplace_'"):
        with run_folder("other_"):
            pass
