"""scripts/validate_generalist.py and scripts/finetune_generalist.py end to end on tiny budgets."""

from __future__ import annotations

import json
import re

import pytest

from tests.scripts import load_script


def test_validation_scores_a_policy_and_caches_the_search_by_row(tmp_path, capsys):
    val = load_script("validate_generalist")
    cache = tmp_path / "val.json"
    args = ["--policies", "generalist", "--rows", "2", "--samples", "2", "--anneal-calls", "5"]
    val.main([*args, "--cache", str(cache)])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.search(r"validation rows 2/2, geo-mean ([0-9.]+), worst ([0-9.]+)", line)
    assert m and 0 < float(m[1]) <= float(m[2])
    keys = list(json.loads(cache.read_text()))
    assert len(keys) == 2 and all(k.endswith("| anneal=5 | reference=each") for k in keys)
    val.main([*args, "--cache", str(cache)])  # read back, same figure
    assert m[0] in capsys.readouterr().out


def test_finetune_table_has_a_row_per_asked_row(tmp_path):
    ft = load_script("finetune_generalist")
    out = tmp_path / "ft.md"
    ft.main(
        ["--rows", "0", "1", "--methods", "zero_shot", "--samples", "2",
         "--search-anneal-calls", "5", "--search-cache", str(tmp_path / "s.json"),
         "--work", str(tmp_path / "w"), "--out", str(out), "--json", str(tmp_path / "ft.json")]
    )  # fmt: skip
    table = [r for r in out.read_text().splitlines() if r.startswith("| ") and "@" in r]
    assert len(table) == 2 and "bert-base@128 @ eth_hosts_4xv100" in table[0]
    assert len(json.loads((tmp_path / "s.json").read_text())) == 2


@pytest.mark.parametrize("budget", ["same", "inclusive"])
def test_finetune_gets_the_calls_annealing_from_the_same_plan_gets(tmp_path, budget):
    """--ft-budget same: the zero-shot plan's calls plus --anneal-calls, as annealing from
    that plan has (until 2 Dec 2026 fine-tuning had --anneal-calls in all, round 0 included)."""
    ft = load_script("finetune_generalist")
    js = tmp_path / "ft.json"
    ft.main(
        ["--rows", "0", "--methods", "zero_shot", "anneal_from_zero_shot", "chain",
         "--samples", "4", "--anneal-calls", "6", "--search-anneal-calls", "5",
         "--tolerance", "-0.5", "--ft-budget", budget, "--ft-samples", "4",
         "--search-cache", str(tmp_path / "s.json"), "--work", str(tmp_path / "w"),
         "--out", str(tmp_path / "ft.md"), "--json", str(js)]
    )  # fmt: skip
    (row,) = json.loads(js.read_text())
    zs = row["zero_shot"]["calls"]
    assert row["chain"]["zero_shot_calls"] == zs  # round 0 is the same zero-shot plan
    assert row["anneal_from_zero_shot"]["calls"] == zs + 6  # a target it cannot reach
    assert row["chain"]["budget"] == (zs + 6 if budget == "same" else 6)
    assert row["chain"]["calls"] <= row["chain"]["budget"]
