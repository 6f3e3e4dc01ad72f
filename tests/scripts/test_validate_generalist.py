"""scripts/validate_generalist.py and scripts/finetune_generalist.py end to end on tiny budgets."""

from __future__ import annotations

import json
import re

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
