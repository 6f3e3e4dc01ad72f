"""scripts/measure_dp_wrappers.py: the figures it prints are measured on real wrapped modules."""

from __future__ import annotations

import pytest

from tests.scripts import load_script


@pytest.mark.timeout(300)
def test_measures_every_wrapper_on_a_one_rank_group() -> None:
    mod = load_script("measure_dp_wrappers")
    m = mod.measure(repeats=1, b=1, port=29561)
    keys = {"plain_fwd_bwd", "fully_shard_fwd_bwd", "fully_shard_no_reshard_fwd_bwd",
            "replicate_fwd_bwd", "plain_adam", "fully_shard_adam"}  # fmt: skip
    assert keys <= set(m) and all(m[k] > 0 for k in keys)
    assert m["param_tensors"] == 52  # the 4-layer GPT-2 of scripts/fidelity_hybrid.py
    import torch.distributed as dist

    assert not dist.is_initialized()  # the group is torn down


def test_bad_arguments_are_refused() -> None:
    mod = load_script("measure_dp_wrappers")
    with pytest.raises(SystemExit, match="must be >= 1"):
        mod.main(["--repeats", "0"])
