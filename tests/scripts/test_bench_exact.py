"""scripts/bench_exact.py: ``--planners`` runs only the planners named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.scripts import load_script


def test_only_the_named_planners_run_and_the_others_show_as_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    be = load_script("bench_exact")
    out = tmp_path / "table.md"
    argv = ["bench_exact.py", "--graphs", "layered-s", "--planners", "ideal_dp", "pipedream_dp"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    be.main()
    lines = out.read_text().splitlines()
    assert lines[0].startswith("<!-- python scripts/bench_exact.py --graphs layered-s")
    head = next(ln for ln in lines if ln.startswith("| graph | nodes"))
    row = next(ln for ln in lines if ln.startswith("| layered-s | 382"))
    cells = dict(zip(head.split("|")[1:-1], row.split("|")[1:-1], strict=True))
    cells = {k.strip(): v.strip() for k, v in cells.items()}
    # ideal_dp is the contiguous optimum, so the chain DP's contiguous split is no better
    assert cells["ideal_dp"].startswith("1.000 (")
    # each cell is objective / the row's best, here ideal_dp's plan: the chain DP's split is
    # 1.212 / 1.048 = 1.157x it (docs/baselines.md's full run)
    assert float(cells["pipedream_dp"].split()[0]) > 1.1
    for name in be.PLANNERS:
        if name not in ("ideal_dp", "pipedream_dp"):
            assert cells[name] == "skipped", name
    # the exact-planner facts: ideal_dp ran and proved its plan, ilp did not run
    facts = next(ln for ln in lines if ln.startswith("| layered-s | done"))
    assert "| True |" in facts and "skipped" in facts
    with pytest.raises(SystemExit):  # a planner that does not exist is refused by argparse
        monkeypatch.setattr(sys, "argv", ["bench_exact.py", "--planners", "magic"])
        be.main()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--graphs", "nope"], r"--graphs: \['nope'\]; valid"),  # was a KeyError
        (["--cap-factor", "0"], "--cap-factor must be a finite number > 0"),  # Device's error
        (["--anneal-budget", "0"], "--anneal-budget must be an integer >= 1"),  # inf cells
        (["--dp-seconds", "nan"], "--dp-seconds must be a finite number > 0"),
        (["--skip", "bogus"], "--skip 'bogus': expected GRAPH:PLANNER"),  # was ignored
    ],
)
def test_bench_exact_refuses_bad_arguments_before_running(argv, says, monkeypatch, capsys):
    import re

    b = load_script("bench_exact")
    monkeypatch.setattr(b, "fiddle_like", lambda *a, **k: pytest.fail("the benchmark began"))
    monkeypatch.setattr("sys.argv", ["bench_exact.py", *argv])
    with pytest.raises(SystemExit) as e:
        b.main()
    assert e.value.code == 2 and re.search(says, capsys.readouterr().err)
