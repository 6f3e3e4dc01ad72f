"""The throughput benchmarks whose figures docs/ records still run, on tiny windows.

They measure speed, so nothing here asserts a rate; each checks that the script runs from
the command line as documented, leaves docs/ alone with ``--no-write``, and reports every
case it measures with a positive figure.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.scripts import ROOT


def _run(script: str, *args: str) -> str:
    before = {p: p.read_bytes() for p in (ROOT / "docs").glob("*.md")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    assert {p: p.read_bytes() for p in (ROOT / "docs").glob("*.md")} == before
    return out


def _rows(out: str, first: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith(f"| {first}")
    ]


def test_bench_hybrid_measures_the_issue_scales_and_the_1t_row() -> None:
    rows = _rows(_run("bench_hybrid", "--seconds", "0.05", "--no-write"), "GPT")
    assert [r[1] for r in rows] == ["64", "1,024", "3,072", "6,144"]
    for r in rows:
        assert float(r[2].replace(",", "")) > 0 and 0 < float(r[7]) < 1  # evals/s, MFU


def test_bench_simulator_checks_the_reference_and_times_both_placements() -> None:
    out = _run("bench_simulator", "--seconds", "0.1", "--windows", "2", "--skip-oplevel",
               "--no-write")  # fmt: skip
    out = out[out.index("<!-- bench:start -->") :]  # the table it would write
    rows = _rows(out, "gpt2-xl")
    assert [r[3] for r in rows] == ["random", "pipeline"]
    assert all(float(re.sub(r"[*,]", "", r[4])) > 0 for r in rows)
    assert "agreed exactly" in out


def test_bench_env_steps_every_env() -> None:
    rows = _rows(_run("bench_env", "--steps", "10", "--no-write"), "`placement_env/")
    assert len(rows) >= 3 and all(float(r[1]) > 0 and r[2] == "10" for r in rows)


def test_bench_quality_pairs_annealing_with_ppo_calls_and_ratios_to_the_best(tmp_path) -> None:
    """One row at tiny budgets: the ratio table is each method over the row's best plan,
    every annealing run paired with a PPO run got exactly that run's oracle calls, and warm
    searches never end worse than the best baseline they start from; ``--merge`` of the JSON
    writes the same tables."""
    out, js = tmp_path / "q.md", tmp_path / "q.json"
    budget = ["--timesteps", "16", "--gdp-timesteps", "8", "--warm-timesteps", "16",
              "--warm-gdp-timesteps", "8", "--ilp-seconds", "2", "--n-envs", "1",
              "--n-steps", "8", "--batch-size", "8", "--hidden", "8"]  # fmt: skip
    _run("bench_quality", "--rows", "rnnlm@k40_2", "--max-groups", "16", *budget,
         "--no-zero-shot", "--out", str(out), "--json", str(js))  # fmt: skip
    text = out.read_text()
    tables = [t for t in text.split("\n\n") if t.startswith("| model @ cluster")]
    ratio = next(t for t in tables if "| best known (ms) |" in t)
    head, _, row = (line.strip("|").split("|") for line in ratio.splitlines()[:3])
    cells = dict(zip((h.strip() for h in head), (c.strip() for c in row)))
    ratios = {k: float(v) for k, v in list(cells.items())[2:]}
    assert min(ratios.values()) == 1.0 and all(r >= 1.0 for r in ratios.values())
    for warm in ("warm-ppo-placeto", "warm-anneal-placeto", "warm-ppo-gdp", "warm-anneal-gdp"):
        assert ratios[warm] <= ratios["best baseline"]
    cost = next(t for t in tables if " s / " in t)  # wall time / oracle calls
    head, _, row = (line.strip("|").split("|") for line in cost.splitlines()[:3])
    calls = {h.strip(): int(c.split("/")[1]) for h, c in zip(head[1:], row[1:])}
    assert calls["anneal"] == max(calls["ppo-placeto"], calls["ppo-gdp"])
    assert calls["warm-anneal-placeto"] == calls["warm-ppo-placeto"]
    assert calls["warm-anneal-gdp"] == calls["warm-ppo-gdp"]
    merged = tmp_path / "m.md"
    _run("bench_quality", "--merge", str(js), "--out", str(merged))
    strip = lambda s: [t for t in s.split("\n\n") if t.startswith("| model")]  # noqa: E731
    assert strip(merged.read_text()) == strip(text)
