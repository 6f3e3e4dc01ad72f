"""Tests for ``python -m graphs info`` and its critical-path helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graphs.__main__ import critical_path, fmt_bytes, main
from graphs.compgraph import CompGraph


def test_critical_path_on_a_diamond() -> None:
    g = CompGraph.build(4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1.0, 5.0, 2.0, 1.0])
    assert critical_path(g, g.flops) == 7.0  # 0 -> 1 -> 3
    assert critical_path(g, np.array([1.0, 1.0, 4.0, 1.0])) == 6.0


def test_info_on_a_tiny_zoo_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path))
    args = ["info", "gpt2", "--batch", "2", "--seq", "8", "-c", "n_layer=1", "-c", "d_model=32",
            "-c", "n_head=2", "-c", "vocab=50", "--max-groups", "4"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "groups           4" in out and "batch            2" in out
    assert "nodes            12  (fwd 4, bwd 4, opt 4)" in out
    assert "critical path" in out and "TFLOPs" in out
    assert main([*args, "--device", "v100", "--cluster", "dgx1_v100_8"]) == 0
    assert "ms on one v100" in capsys.readouterr().out


def test_sizes_print_in_the_unit_named() -> None:
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(3 * 2**20) == "3.00 MiB"
    assert fmt_bytes(16 * 2**30) == "16.00 GiB"  # a V100's memory, as conf/cluster writes it
    assert fmt_bytes(24.9e9) == "23.19 GiB"  # not "24.9 GB" relabelled
    assert fmt_bytes(2**50) == "1024.00 TiB"


def test_info_rejects_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown model, a bad -c and a device kind the cluster lacks: one `error:` line and
    exit status 2 (they exited 1; the device error said "in cluster None" for the default)."""
    for argv, says in (
        (["info", "no-such-model"], "neither a file nor a zoo model"),
        (["info", "gpt2", "-c", "n_layer"], "--config expects KEY=VALUE, got 'n_layer'"),
        (["info", "gpt2", "--device", "k40"], "no device of kind 'k40' in cluster 'dgx1_v100_8'"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: graphs info: ") and says in err and err.count("\n") == 1


def test_info_reports_a_bad_file_or_value_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A bad graph file, ``--max-groups 0`` or a bad config value: one line on stderr and
    exit status 2 (a Python traceback before)."""
    bad = tmp_path / "g.json"
    bad.write_text("not json")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: graphs info: ") and "not valid JSON" in err and str(bad) in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["info", "gpt2", "--max-groups", "0"]) == 2
    assert "max_groups must be an integer >= 1 or None, got 0" in capsys.readouterr().err
    assert main(["info", "gpt2", "-c", "n_layer=abc"]) == 2
    assert "config n_layer = 'abc'; expected an integer" in capsys.readouterr().err


def test_info_refuses_flags_it_would_ignore_or_pass_twice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-c batch=2`` raised zoo.build's TypeError "got multiple values" (a traceback);
    ``--batch`` / ``--seq`` / ``-c`` on a graph file were ignored without a word; the
    parametric ``gpt`` was "neither a file nor a zoo model" (found by fuzzing, 29 Nov 2026)."""
    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path))
    diamond = str(Path(__file__).parents[1] / "data" / "diamond.graph.json")
    for argv, says in (
        (["info", "gpt2", "-c", "batch=2"], "-c batch=...: give it as --batch"),
        (["info", "gpt2", "-c", "max_groups=2"], "-c max_groups=...: give it as --max-groups"),
        (["info", diamond, "--batch", "4"], "only zoo models take --batch;"),
        (
            ["info", diamond, "--seq", "4", "-c", "x=1"],
            "only zoo models take --seq and -c/--config",
        ),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: graphs info: ") and says in err and err.count("\n") == 1
    gpt = ["info", "gpt", "-c", "hidden=256", "-c", "layers=2", "-c", "heads=4", "-c",
           "vocab=1000", "--seq", "128", "--no-cache"]  # fmt: skip
    assert main(gpt) == 0
    out = capsys.readouterr().out
    assert "graph            gpt" in out and "nodes            18  (fwd 6, bwd 6, opt 6)" in out


def test_a_folder_named_like_a_zoo_model_does_not_shadow_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder ``gpt2/`` in the current folder (a run's output) was read as a graph file:
    "gpt2: cannot read file (Is a directory)" (4 Dec 2026). A zoo name names the model
    unless a *file* of that name exists; a folder of another name is still refused."""
    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    args = ["info", "gpt2", "--batch", "2", "--seq", "8", "-c", "n_layer=1", "-c", "d_model=32",
            "-c", "n_head=2", "-c", "vocab=50", "--max-groups", "4"]  # fmt: skip
    assert main(args) == 0
    assert "groups           4" in capsys.readouterr().out
    (tmp_path / "other").mkdir()
    assert main(["info", "other"]) == 2
    assert "other: cannot read file (Is a directory)" in capsys.readouterr().err
