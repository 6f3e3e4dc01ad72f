"""``python -m runners.profile``: the calibration file it writes, with the runtime's own fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphs import clusters
from graphs.cpu_cluster import concurrency_factor, cpu_cluster
from tests.runners.conftest import run_cli_module, run_cli_module_cases

ROOT = Path(__file__).resolve().parents[2]
HYBRID = "{name: gpt2, config: {n_layer: 4, d_model: 32, n_head: 4, vocab: 64, seq: 16, batch: 8}}"


@pytest.mark.timeout(300)
def test_profile_writes_calibration_with_runtime_fit(tmp_path):
    out = tmp_path / "cal.json"
    cmd = [
        sys.executable, "-m", "runners.profile", f"calibration={out}", f"output_dir={tmp_path}",
        "matmul_n=128", "copy_mb=8", "p2p_repeats=2", "concurrency=null",
        "+runtime.model={factory: 'runtime.toy:branchy', config: {batch: 8}}",
        "runtime.microbatches=2", "runtime.rounds=1", "runtime.steps=1",
    ]  # fmt: skip
    cwd = tmp_path / "cwd"  # hydra's folder used to go to ./outputs/profile/... whatever
    cwd.mkdir()  # output_dir said (found by fuzzing); it is the run folder now, as elsewhere
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "runtime with 2 processes: compute x" in proc.stdout
    assert not list(cwd.iterdir()) and (tmp_path / ".hydra" / "overrides.yaml").is_file()
    cal = json.loads(out.read_text())
    fit = cal["runtime"]["2"]
    assert fit["factor"] > 0 and fit["transfer_overhead"] >= 0 and fit["samples"] == 6
    # the toy model's ops are too small for the separately measured cost to be held
    # (fit_runtime_slowdown then fits both), so either way the fit is usable
    assert fit["model"]["factory"] == "runtime.toy:branchy" and fit["microbatches"] == 2
    assert cal["device"]["peak_flops"] > 0 and cal["link"]["latency"] > 0
    assert json.loads((tmp_path / "calibration.json").read_text()) == cal
    c = cpu_cluster(2, calibration=cal, processes=2)
    assert concurrency_factor(cal, 2) == pytest.approx(min(1.0, 1 / fit["factor"]))
    assert c.devices[0].transfer_overhead == pytest.approx(fit["transfer_overhead"])
    # the file is used only when named, and the run says how
    assert f"env.cluster=cpu_2@{out.resolve()}" in proc.stdout
    named = clusters.load(f"cpu_2@{out}")
    assert named.devices[0].peak_flops == cal["device"]["peak_flops"]
    assert named.meta["calibration"] == str(out) and named.meta["calibrated"] is True
    assert clusters.load("cpu_2").meta["calibrated"] is False


#: (overrides, what the refusal says): each refused in one line, exit status 2, before anything
#: is measured
REFUSED = [
    (["threads=0"], "threads = 0; expected an integer >= 1"),
    (["matmul_n=0"], "matmul_n = 0; expected an integer >= 16"),
    (["p2p_repeats=0"], "p2p_repeats = 0"),
    (["concurrency=[0]"], "concurrency[0] = 0"),
    (["concurrency=[2,0]"], "concurrency[1] = 0"),  # the index: it said "[]" (2 Dec 2026)
    ([f"hybrid.model={HYBRID}", "hybrid.recomputes=[none,some]"], "recomputes[1] = 'some'"),
    (["memory_gib=-4"], "memory_gib = -4; expected a finite number > 0"),
    (
        ["+runtime.model={factory: 'runtime.toy:branchy'}", "runtime.rounds=0"],
        "runtime.rounds = 0",
    ),
    ([f"hybrid.model={HYBRID}", "hybrid.probe_worlds=[3]"], "hybrid.probe_worlds[0] = 3"),
    ([f"hybrid.model={HYBRID}", "hybrid.probe_steps=0"], "hybrid.probe_steps = 0"),
    ([f"hybrid.model={HYBRID}", "hybrid.probe_launches=1.5"], "hybrid.probe_launches = 1.5"),
    ([f"hybrid.model={HYBRID}", "hybrid.tps=[]"], "hybrid.tps is empty"),
    ([f"hybrid.model={HYBRID}", "hybrid.recomputes=[some]"], "hybrid.recomputes[0] = 'some'"),
    # a string model, a scalar list, a degree that splits heads, a microbatch over the
    # batch: a traceback-like message, a TypeError, and two measured-then-wrong (27 Nov)
    (["hybrid.model=gpt2"], "hybrid.model = 'gpt2'; expected {name: gpt2"),
    # model specs that failed after minutes of measuring (an OmegaConf message) or ran
    (["runtime.model=5"], "field 'runtime.model' is 5; expected an object"),
    # round 3 of fuzzing: measured for 19 s, the calibration file replaced, then refused
    (
        ["runtime.model={name: nosuch}"],
        "runtime.model = {'name': 'nosuch'} cannot be built: graphs.zoo: unknown model",
    ),
    (
        ["model={factory: 'runtime.toy:tiny_lm', config: {foo: 1}}"],
        "cannot be built: tiny_lm() got an unexpected keyword argument 'foo'",
    ),
    (["+model.bogus=1"], "field 'model.bogus' is not a known key"),
    ([f"hybrid.model={HYBRID}", "hybrid.tps=4"], "hybrid.tps = 4; expected a list"),
    ([f"hybrid.model={HYBRID}", "hybrid.tps=[3]"], "tps[0] = 3: a tensor-parallel degree"),
    ([f"hybrid.model={HYBRID}", "hybrid.micro_sizes=[16]"], "micro_sizes[0] = 16 is larger"),
    # 2 layers cannot make the 4-process probes' 4 pipeline stages
    (
        [f"hybrid.model={HYBRID.replace('n_layer: 4', 'n_layer: 2')}"],
        "the runtime probe '4/p2p' (dp 1, tp 1, pp 4, microbatch size 1) cannot be laid out",
    ),
]  # fmt: skip


def test_profile_refuses_a_bad_setting_before_measuring(tmp_path):
    """One line and exit status 2, nothing measured, no calibration written: memory_gib=-4
    used to be measured and written (a file every later cpu_N@PATH then refused), the others
    ended in tracebacks. The commands run in turn in one interpreter (a process each took
    about 3 s); ``memory_gib=-4`` also in a process of its own, as a user runs it."""
    cases = [
        [f"calibration={tmp_path / f'cal{i}.json'}", f"output_dir={tmp_path / f'run{i}'}",
         "model=null", *overrides]
        for i, (overrides, _) in enumerate(REFUSED)
    ]  # fmt: skip
    results = run_cli_module_cases("runners.profile", cases)
    alone = next(i for i, (o, _) in enumerate(REFUSED) if o == ["memory_gib=-4"])
    proc = subprocess.run([sys.executable, "-m", "runners.profile", *cases[alone]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    results.append((proc.returncode, False, proc.stderr))
    wrong = []
    expected = [*enumerate(REFUSED), (alone, REFUSED[alone])]
    for (i, (overrides, says)), (code, _, err) in zip(expected, results, strict=True):
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if not (
            code == 2
            and last.startswith("error: profile: ")
            and says in last
            and "Traceback" not in err
            and not (tmp_path / f"cal{i}.json").exists()
        ):
            wrong.append(f"{overrides}: exit {code}, said {err[-1500:]!r}; expected {says!r}")
    assert not wrong, "\n".join(wrong)


def test_profile_config_keys_are_the_schemas_and_a_misspelt_key_is_one_line(tmp_path):
    """``bogus=1`` was hydra's "Key 'bogus' is not in struct" with its traceback hint."""
    import dataclasses

    import yaml

    from runners import schema

    conf = yaml.safe_load((ROOT / "conf" / "profile.yaml").read_text())
    keys = {f.name for f in dataclasses.fields(schema.ProfileConfig)}
    assert keys == set(conf) - {"defaults", "hydra"}
    for sub, cls in (("runtime", schema.ProfileRuntime), ("hybrid", schema.ProfileHybrid)):
        assert {f.name for f in dataclasses.fields(cls)} == set(conf[sub])
    for bad, says in (
        ("bogus=1", "unknown config key 'bogus': 'bogus' is not a key of the top level "
                    "(ProfileConfig); valid keys: ['calibration', 'concurrency', 'copy_mb'"),
        ("hybrid.worldz=[2]", "'worldz' is not a key of hybrid (ProfileHybrid); valid keys: "
                              "['micro_sizes', 'model'"),
    ):  # fmt: skip
        cmd = [sys.executable, "-m", "runners.profile", bad, f"output_dir={tmp_path}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("error: unknown config key ")
        assert says in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
        assert not (tmp_path / ".hydra").exists()


def test_profile_refuses_a_calibration_path_it_cannot_write(tmp_path):
    cmd = [sys.executable, "-m", "runners.profile", f"calibration={tmp_path}",
           f"output_dir={tmp_path / 'o'}", "model=null"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot be written" in proc.stderr, proc.stderr[-2000:]


def test_a_calibration_path_under_a_file_or_an_unwritable_folder_is_refused(tmp_path):
    """Found by fuzzing: a path whose parent is a file passed the check, was measured for
    15 s, then failed with FileExistsError; /proc/x.json (writable to root by its mode) too."""
    from omegaconf import OmegaConf

    from runners.profile import check_config
    from tests.runners.conftest import compose

    (tmp_path / "afile").write_text("")
    for bad in (tmp_path / "afile" / "x.json", Path("/proc/x.json")):
        cfg = compose([f"calibration={bad}", "model=null"], config="profile")
        with pytest.raises(ValueError, match="cannot be written"):
            check_config(cfg)
    good = compose([f"calibration={tmp_path / 'new' / 'cal.json'}", "model=null"], config="profile")
    assert check_config(good) == tmp_path / "new" / "cal.json" and OmegaConf.is_config(good)
    assert not list(tmp_path.glob(".devplace-probe-*"))


def test_a_bad_setting_is_refused_before_torch_is_imported(tmp_path):
    """Reporting the error used to import torch (``runtime.launch``, for the failed-rank
    error type): two more seconds before a one-line refusal. A failed rank is still a
    one-line error (exit 2); an unexpected error keeps its traceback."""
    code, torch_imported, err = run_cli_module(
        "runners.profile", ["threads=0", f"output_dir={tmp_path}"]
    )
    assert (code, torch_imported) == (2, False), err[-2000:]
    assert "error: profile: threads = 0" in err

    from runners.common import reported_errors
    from runtime.launch import RankFailure

    with pytest.raises(SystemExit) as stop, reported_errors(None, "profile"):
        raise RankFailure(1, "ValueError", "Number of microbatches (1) must be >= 2")
    assert stop.value.code == 2
    with pytest.raises(ZeroDivisionError), reported_errors(None, "profile"):
        raise ZeroDivisionError("not a user error")


def test_fitted_calibration_always_measures_what_its_probes_need(monkeypatch):
    """The runtime probes run without recomputation: hybrid.recomputes=[full] used to pass
    the checks and fail after minutes of measuring, in the fit, on the missing 'none'."""
    import runtime.hybrid_profile as hp

    seen = {}

    class Stop(Exception):
        pass

    def record(model, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(hp, "calibrate_hybrid", record)
    model = {"name": "gpt2", "config": {"n_layer": 4, "d_model": 32, "n_head": 4, "vocab": 64,
                                        "seq": 16, "batch": 8}}  # fmt: skip
    with pytest.raises(Stop):
        hp.calibrate_hybrid_fitted(
            model, tps=[1], micro_sizes=[2], recomputes=["full"], worlds=[2], probe_worlds=[4]
        )
    assert seen["recomputes"] == ("none", "full")
    assert seen["tps"] == [1, 4] and seen["micro_sizes"] == [1, 2, 4]  # the 4-process probes'


def test_the_closing_line_suggests_the_process_count_the_calibration_serves():
    """After a hybrid calibration (probes on 4 and 8 processes; gpt2_cpu4_hybrid plans 4) the
    closing line said env.cluster=cpu_2@PATH."""
    from omegaconf import OmegaConf

    from runners.profile import suggested_processes

    cfg = OmegaConf.load(ROOT / "conf" / "profile.yaml")
    assert suggested_processes(cfg) == 2  # nothing fitted for more processes
    cfg.hybrid.model = {"name": "gpt2", "config": {}}
    assert suggested_processes(cfg) == 4  # the default probe_worlds [4, 8]
    cfg.hybrid.model = None
    cfg.runtime.model = {"name": "gpt2"}
    cfg.runtime.devices = [3, 4]
    assert suggested_processes(cfg) == 3
