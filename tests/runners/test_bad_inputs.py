"""Bad-input table of what the runners read: training checkpoints (``resume=DIR``), config
values and command-line overrides; and the resume bookkeeping (wall clock, run folders).

A checkpoint row must be refused before anything is unpickled, naming the file, the field
and the value, and saying how to restart. A config row must be refused naming the override
(or config key) and the value.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from graphs.schema import show
from runners import checkpoint, schema
from tests.runners.conftest import compose, small_env

ROOT = Path(__file__).resolve().parents[2]


# ==================================================================== checkpoints
@pytest.fixture(scope="module")
def valid_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real checkpoint of an (untrained) PPO run."""
    import placement_env  # noqa: F401  (registers the env ids)
    from agents.ppo import make_ppo
    from graphs.clusters import load
    from graphs.compgraph import CompGraph
    from placement_env.generators import fixed

    graph = CompGraph.build(4, [(0, 1), (1, 2), (2, 3)], flops=1e9, out_bytes=1e6)
    model = make_ppo(
        "placement_env/Sweep-v0",
        "placeto",
        env_kwargs={"generator": fixed(graph, load("cpu_2"))},
        n_steps=16,
        net_kwargs={"hidden": 16},
        seed=0,
    )
    run = tmp_path_factory.mktemp("run")
    return checkpoint.save(run, model, extra={"note": "test"}).read_bytes()


def _split(raw: bytes) -> tuple[dict, bytes]:
    end = raw.index(b"\n")
    return json.loads(raw[len(checkpoint.MAGIC) : end]), raw[end + 1 :]


def _signed(obj: Any) -> bytes:
    """``obj`` pickled with a correct header and signature (as a bug of ours could write it)."""
    payload = pickle.dumps(obj)
    head = {"version": checkpoint.VERSION, "bytes": len(payload), "hmac_sha256": ""}
    head["hmac_sha256"] = checkpoint._sign(payload)
    return checkpoint.MAGIC + json.dumps(head).encode() + b"\n" + payload


def _reheader(**changes: Any) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        head, payload = _split(raw)
        head.update(changes)
        return checkpoint.MAGIC + json.dumps(head).encode() + b"\n" + payload

    return change


class Runs:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@dataclass(frozen=True)
class BadCheckpoint:
    cls: str
    change: Callable[[bytes], bytes]
    field: str
    value: Callable[[bytes], Any]  # the refused value, from the valid file's bytes

    def __str__(self) -> str:
        return f"{self.cls}-{self.field}"


def _state(raw: bytes) -> dict:
    return pickle.loads(_split(raw)[1])


CHECKPOINTS = [
    BadCheckpoint("truncated", lambda b: b[:-100], "bytes", lambda b: _split(b)[0]["bytes"]),
    BadCheckpoint(
        "truncated", lambda b: b[: b.index(b"\n") + 1], "bytes", lambda b: _split(b)[0]["bytes"]
    ),
    BadCheckpoint("truncated", lambda b: b[:30], "header", lambda b: b[len(checkpoint.MAGIC) : 30]),
    BadCheckpoint("empty", lambda b: b"", "header", lambda b: b""),
    BadCheckpoint(
        "foreign",
        lambda b: pickle.dumps({"version": 1, "model": b""}),
        "header",
        lambda b: pickle.dumps({"version": 1, "model": b""})[:24],
    ),
    BadCheckpoint("foreign", lambda b: b'{"version": 2}', "header", lambda b: b'{"version": 2}'),
    BadCheckpoint(
        "altered",
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),
        "hmac_sha256",
        lambda b: _split(b)[0]["hmac_sha256"][:16],
    ),
    BadCheckpoint(
        "altered",
        _reheader(hmac_sha256="0" * 64),
        "hmac_sha256",
        lambda b: "0" * 16,
    ),
    BadCheckpoint(
        "damaged_header",
        lambda b: checkpoint.MAGIC + b"{not json\n" + _split(b)[1],
        "header",
        lambda b: b"{not json",
    ),
    BadCheckpoint("wrong_type", _reheader(bytes="12"), "bytes", lambda b: "12"),
    BadCheckpoint("wrong_type", _reheader(bytes=True), "bytes", lambda b: True),
    BadCheckpoint("out_of_range", _reheader(version=3), "version", lambda b: 3),
    BadCheckpoint("non_object", lambda b: _signed([1, 2]), "(top level)", lambda b: [1, 2]),
    BadCheckpoint(
        "missing",
        lambda b: _signed({k: v for k, v in _state(b).items() if k != "rng"}),
        "(top level)",
        lambda b: sorted(k for k in _state(b) if k != "rng"),
    ),
    BadCheckpoint(
        "wrong_type", lambda b: _signed({**_state(b), "algo": "PPO"}), "algo", lambda b: "PPO"
    ),
    BadCheckpoint(
        "wrong_type", lambda b: _signed({**_state(b), "extra": [1]}), "extra", lambda b: [1]
    ),
]


@pytest.mark.parametrize("bad", CHECKPOINTS, ids=str)
def test_bad_checkpoint_is_refused_unread_naming_file_field_value_and_restart(
    tmp_path: Path, valid_checkpoint: bytes, bad: BadCheckpoint
) -> None:
    path = tmp_path / checkpoint.CHECKPOINT
    path.write_bytes(bad.change(valid_checkpoint))
    with pytest.raises(ValueError) as info:
        checkpoint.load(tmp_path)
    msg = str(info.value)
    assert str(path) in msg and f"'{bad.field}'" in msg, msg
    assert show(bad.value(valid_checkpoint)) in msg, msg
    assert "Delete it to restart this run" in msg and "start a new run" in msg, msg


def test_valid_checkpoint_loads(tmp_path: Path, valid_checkpoint: bytes) -> None:
    (tmp_path / checkpoint.CHECKPOINT).write_bytes(valid_checkpoint)
    state = checkpoint.load(tmp_path)
    # the digest of the run's config.yaml (None: the fixture's folder had none)
    assert state["extra"] == {"note": "test", checkpoint.CONFIG_DIGEST: None} and state["model"]


def test_foreign_pickle_is_never_unpickled(tmp_path: Path, valid_checkpoint: bytes) -> None:
    """A pickle that would run code when loaded: refused, and the code did not run, whether
    it comes bare (a foreign file) or behind a copied header (a tampered checkpoint)."""
    marker = tmp_path / "code_ran"
    evil = pickle.dumps(Runs(str(marker)))
    head, _ = _split(valid_checkpoint)
    forged = {**head, "bytes": len(evil)}
    for raw in (evil, checkpoint.MAGIC + json.dumps(forged).encode() + b"\n" + evil):
        (tmp_path / checkpoint.CHECKPOINT).write_bytes(raw)
        with pytest.raises(ValueError, match="is not unpickled"):
            checkpoint.load(tmp_path)
        assert not marker.exists()
    pickle.loads(evil)  # the check is real: loading it plainly does run the code
    assert marker.exists()


def test_checkpoint_of_another_key_is_refused(
    tmp_path: Path, valid_checkpoint: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint signed on another machine or by another user (another key file)."""
    (tmp_path / checkpoint.CHECKPOINT).write_bytes(valid_checkpoint)
    monkeypatch.setenv(checkpoint.KEY_ENV, str(tmp_path / "other.key"))
    with pytest.raises(ValueError, match="does not carry this user's signature") as info:
        checkpoint.load(tmp_path)
    assert str(tmp_path / "other.key") in str(info.value)
    assert "DEVPLACE_CHECKPOINT_KEY_FILE" in str(info.value)


def test_missing_checkpoint_and_bad_key_file(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="checkpoint.pkl does not exist"):
        checkpoint.load(tmp_path)
    key = tmp_path / "k"
    key.write_text("not hex")
    monkeypatch.setenv(checkpoint.KEY_ENV, str(key))
    with pytest.raises(ValueError, match=f"checkpoint key file {key} does not hold a hex key"):
        checkpoint._key()


# ============================================================ config and overrides
@dataclass(frozen=True)
class BadOverride:
    cls: str
    override: str
    key: str
    value: Any
    schema: type = schema.TrainConfig

    def __str__(self) -> str:
        return f"{self.schema.__name__}-{self.override}"


def ov(cls: str, text: str, value: Any, sch: type = schema.TrainConfig) -> BadOverride:
    return BadOverride(cls, text, text.split("=", 1)[0], value, sch)


OVERRIDES = [
    ov("out_of_range", "train.timesteps=-5", -5),
    ov("out_of_range", "train.timesteps=0", 0),
    ov("wrong_type", "train.timesteps=true", True),
    ov("wrong_type", "train.timesteps=2.5", 2.5),
    ov("wrong_type", "train.timesteps=many", "many"),
    ov("out_of_range", "train.seconds=-1", -1),
    ov("out_of_range", "train.seconds=0", 0),
    ov("non_finite", "train.seconds=inf", float("inf")),
    ov("non_finite", "train.seconds=nan", float("nan")),
    ov("out_of_range", "train.checkpoint_every=-1", -1),
    ov("out_of_range", "seed=-1", -1),
    ov("huge_int", "seed=4294967296", 2**32),
    ov("out_of_range", "torch_threads=0", 0),
    ov("out_of_range", "env.microbatches=0", 0),
    ov("huge_int", "env.microbatches=1000000000000000000000000000000", 10**30),
    ov("out_of_range", "env.schedule=zigzag", "zigzag"),
    ov("out_of_range", "env.objective=speed", "speed"),
    ov("out_of_range", "env.oracle=magic", "magic"),
    ov("out_of_range", "env.max_groups=0", 0),
    ov("out_of_range", "env.baseline_budget=-3", -3),
    ov("out_of_range", "agent.kind=evolution", "evolution"),
    ov("out_of_range", "agent.budget=0", 0),
    ov("out_of_range", "agent.ppo.gamma=1.5", 1.5),
    ov("out_of_range", "agent.ppo.learning_rate=0", 0),
    ov("out_of_range", "agent.ppo.learning_rate=-1e-3", -1e-3),
    ov("out_of_range", "agent.ppo.n_steps=0", 0),
    ov("out_of_range", "agent.ppo.batch_size=-64", -64),
    ov("out_of_range", "agent.ppo.ent_coef=-0.1", -0.1),
    ov("out_of_range", "agent.ppo.n_envs=0", 0),
    ov("out_of_range", "logger.kind=mlflow", "mlflow"),
    ov("out_of_range", "logger.log_every=0", 0),
    ov("out_of_range", "logger.mode=bogus", "bogus"),  # a pydantic error after the build
    ov("wrong_type", "rehearse=no", "no", schema.ExecuteConfig),  # bool('no') rehearsed
    ov("wrong_type", "steps=2.5", 2.5, schema.ExecuteConfig),
    ov("out_of_range", "seeds=[0,-1]", [0, -1], schema.EvaluateConfig),
    ov("empty", "seeds=[]", [], schema.EvaluateConfig),
    ov("out_of_range", "train.timesteps=-1", -1, schema.EvaluateConfig),
    ov("out_of_range", "samples=0", 0, schema.PlanConfig),
    ov("out_of_range", "seed=-2", -2, schema.PlanConfig),
    ov("out_of_range", "link_exponent=-1", -1, schema.PlanConfig),
    # boolean fields: hydra refused these itself, in several lines with no `error:` line
    ov("wrong_type", "agent.warm_start=maybe", "maybe"),
    ov("wrong_type", "agent.warm_search=1", 1),
    ov("wrong_type", "train.progress=maybe", "maybe"),
    ov("wrong_type", "run_baselines=maybe", "maybe"),
    ov("wrong_type", "greedy=maybe", "maybe", schema.PlanConfig),
]


@pytest.mark.parametrize("bad", OVERRIDES, ids=str)
def test_bad_override_is_refused_naming_override_key_and_value(bad: BadOverride) -> None:
    with pytest.raises(ValueError) as info:
        schema.check_override_values(bad.schema, ["+env=rnnlm_k40_2", bad.override])
    msg = str(info.value)
    assert repr(bad.override) in msg and repr(bad.key) in msg, msg
    assert show(bad.value) in msg or repr(bad.value) in msg, msg


@pytest.mark.parametrize("text", ["train.timestep=5", "env.microbatch=4", "agent.ppo.lr=1e-3"])
def test_unknown_override_key_is_refused(text: str) -> None:
    key = text.split("=")[0]
    with pytest.raises(ValueError, match=f"unknown config key '{key}'.*valid keys"):
        schema.check_overrides(schema.TrainConfig, [text])


def test_good_overrides_pass() -> None:
    schema.check_override_values(
        schema.TrainConfig,
        ["+env=rnnlm_k40_2", "train.seconds=null", "train.timesteps=10", "agent.ppo.gamma=1",
         "agent.warm_start=false", "train.progress=true"],
    )  # fmt: skip


def test_composed_config_is_checked_by_train(graph_file: Path, tmp_path: Path) -> None:
    """Values set after the command line (config files, compose) are checked by train()."""
    from runners.train import train

    cfg = compose([*small_env(graph_file), "train.timesteps=-5"])
    with pytest.raises(
        ValueError, match=r"config key 'train.timesteps' is -5; expected an integer >= 1"
    ):
        train(cfg, tmp_path / "run", echo=lambda s: None)
    assert not (tmp_path / "run").exists()
    for name in ("rnnlm_k40_2", "gpt2_8gpu"):  # the shipped configs are valid
        schema.check_values(schema.TrainConfig, compose([f"+env={name}"]))


def test_cli_exits_2_on_a_negative_budget(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runners.train", "+env=rnnlm_k40_2", "train.timesteps=-5"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'train.timesteps' is -5; expected an integer >= 1" in proc.stderr
    assert not (tmp_path / "outputs").exists()


# ======================================================================== resume
def test_resume_makes_no_stray_run_folder(tmp_path: Path) -> None:
    """``resume=DIR`` logs into DIR: no new, empty outputs/train/DATE/TIME folder."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "runners.train", f"resume={run}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "no config.yaml there" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))
    assert not (run / ".hydra").exists()
    # a folder that is no run is left as it was: it used to get error.txt and train.log
    assert not list(run.iterdir())
    (run / "config.yaml").write_text("foo: 1\n")  # another program's: so since 3 Dec 2026
    proc = subprocess.run(
        [sys.executable, "-m", "runners.train", f"resume={run}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "is not the config of a runners.train run" in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]  # not even a lock file


def test_other_runners_refuse_a_folder_holding_a_set_aside_run(tmp_path: Path) -> None:
    """runners.plan into a folder whose earlier train run a killed command had set aside
    wrote its result.json there, and the next runners.train command took the folder for the
    killed run's and deleted the earlier run (fuzzing, 3 Dec 2026)."""
    from runners import schema

    (tmp_path / "run" / ".earlier_run").mkdir(parents=True)
    for s in (schema.PlanConfig, schema.EvaluateConfig, schema.ExecuteConfig):
        with pytest.raises(
            ValueError, match=r"holds a runners.train run set aside in \.earlier_run/"
        ):
            schema.check_output_dir(s, [f"output_dir={tmp_path / 'run'}"])
    schema.check_output_dir(schema.TrainConfig, [f"output_dir={tmp_path / 'run'}"])  # puts back
    from runners import folder_lock

    with folder_lock.held(tmp_path / "run", "train"):  # a new run going on: not "stopped"
        with pytest.raises(ValueError, match=r"is in use by runners.train \(pid"):
            schema.check_output_dir(schema.PlanConfig, [f"output_dir={tmp_path / 'run'}"])


def test_ctrl_c_after_the_earlier_run_was_put_back_offers_no_resume(tmp_path: Path, capsys) -> None:
    """Ctrl-C of a new run before its first checkpoint said "resume=DIR continues it", but
    the folder was the earlier run's again: that resume continued the earlier run."""
    import os

    from runners import earlier_run
    from runners.common import reported_errors

    earlier_run.GIVEN_BACK.add(os.path.realpath(tmp_path))
    try:
        with pytest.raises(SystemExit), reported_errors(tmp_path, "train"):
            raise KeyboardInterrupt
    finally:
        earlier_run.GIVEN_BACK.discard(os.path.realpath(tmp_path))
    err = capsys.readouterr().err
    assert "before its first checkpoint: the earlier run in" in err and "resume=" not in err


def test_wall_clock_counts_a_session_killed_with_sigkill(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal, time
        from runners.checkpoint import SessionClock
        SessionClock({str(tmp_path)!r}, interval=0.1).start()
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    clock = checkpoint.SessionClock(tmp_path).start()
    clock.stop()
    sessions = json.loads((tmp_path / checkpoint.WALL_CLOCK).read_text())["sessions"]
    assert len(sessions) == 2
    assert 1.3 <= sessions[0][1] - sessions[0][0] < 30  # the killed session, to its last tick
    assert clock.total() >= sessions[0][1] - sessions[0][0]


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"sessions": [[0, Infinity]]}', "expected unix seconds"),  # wall_seconds null
        ('{"sessions": [[0, 1e12]]}', "expected unix seconds"),  # in the future
        ('{"sessions": [[10, 5]]}', "start <= end"),
        ('{"sessions": [[1, 2, 3]]}', "is not \\[start, end\\]"),
        ('{"sessions": {"a": 1}}', "'sessions' is not a list"),
        ('{"session": []}', "KeyError"),
        ("[[0, 1]", "JSONDecodeError"),
    ],
)
def test_a_damaged_wall_clock_is_refused_by_name(tmp_path: Path, text: str, says: str) -> None:
    """It was read as no sessions (counted from now), or summed Infinity / 1e9 seconds into
    wall_seconds without a word (fuzzing, 2 Dec 2026)."""
    (tmp_path / checkpoint.WALL_CLOCK).write_text(text)
    with pytest.raises(ValueError, match=rf"wall_clock.json is not a run's wall clock .*{says}"):
        checkpoint.SessionClock(tmp_path).start()
    (tmp_path / checkpoint.WALL_CLOCK).write_text('{"sessions": [[100.0, 160.5]]}')
    clock = checkpoint.SessionClock(tmp_path).start()
    clock.stop()
    assert 60.5 <= clock.total() < 70


# ============================================================ resume bookkeeping files
GOOD_BASELINE = {"step_time": 0.5, "oracle_calls": 1, "seconds": 0.1, "oom": False, "error": None}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A PPO run killed after its first update (checkpoint, baselines, warm start written)."""
    from graphs import io as gio
    from runners.train import CrashForTest, train
    from tests.runners.conftest import chain_graph

    root = tmp_path_factory.mktemp("killed")
    gio.save(chain_graph(), root / "g.json")
    run = root / "run"
    ov = [*small_env(root / "g.json"), "env.baselines=[expert]", "train.timesteps=4096",
          "agent.ppo.n_steps=16", "train.checkpoint_every=1"]  # fmt: skip
    with pytest.raises(CrashForTest):
        train(compose([*ov, "train.crash_after_updates=1"]), run, echo=lambda s: None)
    assert (run / "checkpoint.pkl").exists() and (run / "warm_start.json").exists()
    return run, ov


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("baselines.json", {"expert": {**GOOD_BASELINE, "step_time": -0.001}},
         "field 'expert.step_time' is -0.001"),  # gave a speed-up of x-0.34
        ("baselines.json", {"expert": [1, 2]}, "field 'expert' is [1, 2]; expected an object"),
        ("baselines.json", {"expert": {"step_time": 0.5}}, "field 'expert.oracle_calls' is missing"),
        ("baselines.json", {"expert": {**GOOD_BASELINE, "oom": "no"}}, "field 'expert.oom'"),
        ("baselines.json", "{x", "not valid JSON"),
        ("run_info.json", "", "not valid JSON"),
        ("run_info.json", {"wandb_id": 5}, "field 'wandb_id' is 5"),
        ("warm_start.json", {"name": "expert", "placement": [0, 99]}, "field 'placement[1]' is 99"),
        ("warm_start.json", {"name": "expert", "placement": [0, 1]}, "has 2 entries"),
        ("warm_start.json", {"placement": [0]}, "field 'name' is missing"),
        ("warm_start.json", {"name": "expert", "zero_shot_calls": -3},
         "field 'zero_shot_calls' is -3"),
        ("warm_start.json", {"name": "expert", "zero_shot_calls": 2.5},
         "field 'zero_shot_calls' is 2.5"),
    ],
)  # fmt: skip
def test_resume_names_a_bad_bookkeeping_file_and_its_field(
    killed_run: tuple[Path, list[str]], tmp_path: Path, name: str, content: Any, says: str
) -> None:
    """baselines.json, run_info.json and warm_start.json of a resumed run are read strictly:
    they were taken as they were (a negative step time), or failed with a bare JSON or
    numpy message naming no file."""
    import shutil

    from runners.train import train

    killed, ov = killed_run
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    text = content if isinstance(content, str) else json.dumps(content)
    (run / name).write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(run / name))) as exc:
        train(compose([*ov, f"resume={run}"]), run, echo=lambda s: None)
    assert says in str(exc.value)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("+agent.ppo.extra.clip_range=-1", "agent.ppo.extra.clip_range is -1; expected a number > 0"),
        ("+agent.ppo.extra.gae_lambda=5", "agent.ppo.extra.gae_lambda is 5; expected a number in [0, 1]"),
        ("+agent.ppo.extra.bogus=5", "agent.ppo.extra.bogus: MaskablePPO takes no 'bogus'; valid:"),
    ],
)  # fmt: skip
def test_ppo_extra_options_are_checked_before_anything_runs(
    graph_file: Path, tmp_path: Path, monkeypatch, extra: str, says: str
) -> None:
    """agent.ppo.extra went to SB3 unchecked: clip_range=-1 and gae_lambda=5 trained to the
    end, an unknown key was a TypeError traceback after the baselines."""
    from runners import common
    from runners.train import train

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    cfg = compose([*small_env(graph_file), extra])
    with pytest.raises(ValueError, match=re.escape(says)):
        train(cfg, tmp_path, echo=lambda s: None)


def test_a_mistyped_resume_folder_is_refused_and_not_created(tmp_path: Path, capsys) -> None:
    """resume=DIR with a DIR that does not exist: hydra was told to log there, so the typo
    became a folder holding error.txt and train.log."""
    missing = tmp_path / "outputs" / "train" / "typo"
    with pytest.raises(SystemExit) as exc:
        schema.run_checked(schema.TrainConfig, lambda: pytest.fail("ran"), [f"resume={missing}"])
    assert exc.value.code == 2 and not missing.exists() and not missing.parent.exists()
    assert f"resume={missing}: no such run folder" in capsys.readouterr().err


def test_resume_through_an_interpolation_finds_the_folder(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """`resume=${oc.env:HOME}/runs/a` was looked for as that text: "no such run folder"
    (3 Dec 2026); it is resolved as hydra will, and one that cannot be is named."""
    from runners import schema

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("DEVPLACE_TEST_ROOT", str(tmp_path))
    ran: list[bool] = []
    schema.run_checked(schema.TrainConfig, lambda: ran.append(True),
                       ["resume=${oc.env:DEVPLACE_TEST_ROOT}/run"])  # fmt: skip
    assert ran == [True]
    for arg, says in (
        ("resume=${oc.env:DEVPLACE_TEST_ROOT}/nosuch",
         f"/nosuch ({tmp_path}/nosuch): no such run folder"),
        ("resume=${oc.env:DEVPLACE_NO_SUCH_VAR}/run", "cannot resolve it (KeyError"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            schema.run_checked(schema.TrainConfig, lambda: pytest.fail("ran"), [arg])
        assert exc.value.code == 2
        assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, says",
    [
        ("garbage: [\n", "ParserError"),  # yaml's traceback
        ("", "MissingMandatoryValue"),  # omegaconf's traceback
        ("x: 1\n", "Key 'x' not in 'TrainConfig'"),  # named no file
    ],
)
def test_resume_of_a_broken_config_names_the_file(tmp_path: Path, text: str, says: str) -> None:
    """Found by fuzzing: a config.yaml that is not a run's ended in a traceback."""
    from runners.train import train

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(text)
    cfg = compose([f"resume={run}"])
    with pytest.raises(
        ValueError,
        match=rf"resume={run}: {run}/config.yaml is not the config of a runners.train run \(.*{says}",
    ):
        train(cfg, run, echo=lambda s: None)


def test_a_signal_while_hydra_composes_the_config_is_one_line(capsys) -> None:
    """SIGTERM about half a second after the start, while hydra was still composing the
    config (before the runner's own handler), was a Terminated traceback, exit 1."""
    from runners import schema
    from runners.common import Terminated

    def composing() -> None:
        raise Terminated(15)

    with pytest.raises(SystemExit) as info:
        schema.run_checked(schema.PlanConfig, composing, [])
    assert info.value.code == 143
    assert capsys.readouterr().err == "error: runners.plan terminated by signal 15\n"


def test_ctrl_c_is_one_error_line_with_error_txt(tmp_path: Path, capsys) -> None:
    """Ctrl-C in any runner printed a KeyboardInterrupt traceback and left no error.txt or
    log line (SIGTERM already gave one line; fuzzing, 2 Dec 2026)."""
    from runners.common import reported_errors

    with pytest.raises(SystemExit) as info, reported_errors(tmp_path, "train"):
        raise KeyboardInterrupt
    assert info.value.code == 130
    err = capsys.readouterr().err
    assert (
        err
        == f"error: runners.train interrupted (Ctrl-C); python -m runners.train resume={tmp_path} continues it\n"
    )
    assert (tmp_path / "error.txt").read_text().startswith("runners.train failed: interrupted")
    assert "interrupted (Ctrl-C)" in (tmp_path / "train.log").read_text()


def test_ctrl_c_inside_compiled_code_is_ctrl_c(tmp_path: Path, capsys) -> None:
    """Ctrl-C arriving inside a numba kernel came out as "SystemError: CPUDispatcher(...)
    returned a result with an exception set" (CPython makes the pending KeyboardInterrupt
    its cause): 86 lines and exit 1 (fuzzing, 2 Dec 2026, 1 try in 6)."""
    from runners.common import Terminated, reported_errors

    with pytest.raises(SystemExit) as info, reported_errors(tmp_path, "plan"):
        raise SystemError("CPUDispatcher(<function simulate>) returned a result with an "
                          "exception set") from KeyboardInterrupt()  # fmt: skip
    assert info.value.code == 130
    assert capsys.readouterr().err == "error: runners.plan interrupted (Ctrl-C)\n"
    with pytest.raises(SystemExit) as info, reported_errors(tmp_path, "plan"):
        raise SystemError("returned a result with an exception set") from Terminated(15)
    assert info.value.code == 143
    with pytest.raises(SystemError), reported_errors(tmp_path, "plan"):
        raise SystemError("a SystemError of its own keeps its traceback")
    assert (tmp_path / "error.txt").read_text().startswith("runners.plan failed: SystemError")


def test_an_unusable_checkpoint_key_is_named_before_any_work(
    graph_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """$DEVPLACE_CHECKPOINT_KEY_FILE naming a folder (or a read-only home) raised an OSError
    traceback at the first checkpoint, after the baselines and a rollout (fuzzing)."""
    from runners.train import train
    from tests.runners.conftest import compose, small_env

    monkeypatch.setenv(checkpoint.KEY_ENV, str(tmp_path))  # a folder
    with pytest.raises(ValueError, match=rf"checkpoint key file {tmp_path} cannot be read"):
        checkpoint.check_key()
    with pytest.raises(ValueError, match="DEVPLACE_CHECKPOINT_KEY_FILE at a file you can write"):
        train(compose([*small_env(graph_file), "train.checkpoint_every=1"]), tmp_path / "run",
              echo=lambda s: None)  # fmt: skip
    assert not (tmp_path / "run" / "baselines.json").exists()
