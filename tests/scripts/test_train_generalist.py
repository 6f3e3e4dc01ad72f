"""``scripts/train_generalist.py``: the ``--net`` settings."""

from __future__ import annotations

import re

import pytest

from scripts.train_generalist import main, output_path, parse_net


def test_parse_net_types_each_setting() -> None:
    assert parse_net([]) == {}
    got = parse_net(["hidden=128", "dropout=0.1", "attn_layers=3"])
    assert got == {"hidden": 128, "dropout": 0.1, "attn_layers": 3}
    assert isinstance(got["hidden"], int) and isinstance(got["dropout"], float)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("hidden", "expected KEY=VALUE"),
        ("width=128", "expected KEY=VALUE with KEY one of"),
        ("hidden=12.5", "'12.5' is not an integer"),
        ("dropout=lots", "'lots' is not a number"),
        ("hidden=0", "hidden must be at least 1"),
        ("dropout=1.5", r"dropout must be in \[0, 1\)"),
        ("hidden=66", "hidden=66 must be divisible by heads=4"),
    ],
)
def test_parse_net_names_a_bad_item(item: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        parse_net([item])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--anneal-calls", "-1"], "--anneal-calls must be an integer >= 0"),
        (["--teacher-seconds", "-5"], "--teacher-seconds must be a finite number > 0"),
        (["--max-minutes", "inf"], "--max-minutes must be a finite number > 0"),
        (["--corpus-seeds", "-1"], "--corpus-seeds must be integers >= 0"),
        (["--stages", "bogus"], r"--stages must be among \['label', 'train', 'export'\]"),
        (["--teachers", "nope"], "--teachers must be op-placement baselines"),
        (["--teachers", "megatron_grid"], "--teachers must be op-placement baselines"),
    ],
)
def test_bad_arguments_stop_before_any_labelling(argv, says, tmp_path, capsys, monkeypatch):
    """Found by fuzzing: these were taken and labelling (minutes to hours) began; --teachers
    nope labelled every problem with an error and then failed in collate."""
    from agents import generalist as G

    monkeypatch.setattr(G, "label_corpus", lambda *a, **k: pytest.fail("labelling began"))
    with pytest.raises(SystemExit) as e:
        main(["--work", str(tmp_path), *argv])
    assert e.value.code == 2 and re.search(says, capsys.readouterr().err)


def test_the_export_goes_to_the_work_folder_unless_named(tmp_path):
    """The shipped agents/pretrained/generalist.pt used to be --out's default, so any run
    that reached the export replaced the shipped policy."""
    assert output_path(tmp_path, None) == tmp_path / "generalist.pt"
    assert output_path(tmp_path, tmp_path / "x.pt") == tmp_path / "x.pt"
