"""``scripts/train_generalist.py``: the ``--net`` settings."""

from __future__ import annotations

import pytest

from scripts.train_generalist import parse_net


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
