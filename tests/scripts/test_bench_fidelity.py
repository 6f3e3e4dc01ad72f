"""scripts/bench_fidelity.py: the summary figures and the predicted-vs-measured plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script


def _rows() -> list[dict]:
    """Three plans: measured 100 / 200 / 400 ms; ``calibrated`` 10 % over on each,
    ``in_order`` ranked the wrong way on the last two."""
    rows = []
    for name, meas, inord in (("a", 0.1, 0.08), ("b", 0.2, 0.30), ("c", 0.4, 0.25)):
        rows.append(dict(cluster="cpu_2", plan=name, runs=[0.9 * meas, meas, 1.2 * meas],
                         measured=meas, calibrated=1.1 * meas, in_order=inord))  # fmt: skip
    return rows


def test_summary_is_spearman_and_mape_by_hand() -> None:
    bf = load_script("bench_fidelity")
    rho, mape = bf.summarize(_rows(), "calibrated")
    assert rho == pytest.approx(1.0) and mape == pytest.approx(10.0)
    rho, mape = bf.summarize(_rows(), "in_order")
    # ranks (1, 3, 2) against (1, 2, 3): 1 - 6 * 2 / (3 * 8) = 0.5; errors 20 %, 50 %, 37.5 %
    assert rho == pytest.approx(0.5) and mape == pytest.approx((20 + 50 + 37.5) / 3)


def test_the_plot_is_drawn_from_a_raw_file_without_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf = load_script("bench_fidelity")
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"rows": _rows()}))
    out = tmp_path / "fid.png"

    def no_measuring(*a, **k):
        raise AssertionError("--plot-from must not measure")

    monkeypatch.setattr(bf, "execute_many", no_measuring)
    monkeypatch.setattr(
        sys, "argv", ["bench_fidelity.py", "--plot-from", str(raw), "--plot", str(out)]
    )
    bf.main()
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # default: beside the raw file
    monkeypatch.setattr(sys, "argv", ["bench_fidelity.py", "--plot-from", str(raw)])
    bf.main()
    assert raw.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
