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


def test_bench_hybrid_measures_the_three_issue_scales() -> None:
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
