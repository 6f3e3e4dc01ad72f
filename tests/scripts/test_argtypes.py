"""scripts/argtypes.py and the scripts that use it: a bad number, list or path is argparse's
one-line error (exit status 2) before any work (found by fuzzing: --seconds inf never ended,
--steps 0 divided by zero, --rows 5 was a KeyError after the earlier rows trained)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.scripts import ROOT, load_script


def test_the_types_by_hand(tmp_path):
    a = load_script("argtypes")
    assert a.positive_int("3") == 3 and a.positive_float("0.5") == 0.5
    assert a.int_list("0, 1,24") == [0, 1, 24]
    assert a.image_path(str(tmp_path / "new" / "x.png")).name == "x.png"
    for fn, bad in ((a.positive_int, "0"), (a.positive_int, "1.5"), (a.positive_float, "inf"),
                    (a.positive_float, "-5"), (a.positive_float, "nan"), (a.int_list, "8,abc"),
                    (a.int_list, "8.0"), (a.image_path, str(tmp_path)),
                    (a.image_path, str(tmp_path / "plot")),
                    (a.image_path, str(tmp_path / "f.txt" / "x.png"))):  # fmt: skip
        (tmp_path / "f.txt").write_text("")
        with pytest.raises(argparse.ArgumentTypeError):
            fn(bad)


@pytest.mark.parametrize(
    "script, args, says",
    [
        ("bench_hybrid", ["--seconds", "inf", "--no-write"], "argument --seconds: expected a finite"),
        ("bench_env", ["--steps", "0", "--no-write"], "argument --steps: expected an integer >= 1"),
        ("bench_simulator", ["--windows", "0", "--no-write"], "argument --windows"),
        ("bench_hybrid_learning", ["--rows", "5", "--no-write"], "--rows: [5] are not rows"),
        ("bench_hybrid_learning", ["--seeds", "abc"], "argument --seeds: expected comma-separated"),
        ("plot_hybrid_validation", ["--out", "/tmp"], "argument --out: "),
        ("fidelity_hybrid", ["--rounds", "0"], "argument --rounds: expected an integer >= 1"),
        ("measure_dp_wrappers", ["--repeats", "0"], "argument --repeats: expected an integer"),
        ("bench_baselines", ["--cluster", "nosuch"], "unknown cluster 'nosuch'"),
        ("bench_ilp_symmetry", ["--time-limit", "-1"], "argument --time-limit: expected a finite"),
        ("bench_extract", ["--max-groups", "0"], "argument --max-groups: expected an integer"),
        # any zoo name was taken, then failed after the extraction (fuzzing, 2 Dec 2026)
        ("bench_extract", ["--model", "bert-base"], "argument --model: invalid choice: 'bert-base'"),
    ],
)  # fmt: skip
def test_a_script_refuses_a_bad_argument_in_one_line(script, args, says):
    proc = subprocess.run([sys.executable, "-m", f"scripts.{script}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert ": error: " in last and says in last and "Traceback" not in proc.stderr, proc.stderr
