"""runtime.hybrid_profile.measure_wrappers and scripts/measure_dp_wrappers.py: the figures are
measured on real wrapped modules, on a 1-rank group that is torn down after."""

from __future__ import annotations

import pytest

from tests.scripts import load_script


@pytest.mark.timeout(300)
def test_measures_every_wrapper_on_a_one_rank_group(capsys) -> None:
    import torch.distributed as dist

    from runtime.hybrid_profile import measure_wrappers

    model = load_script("fidelity_hybrid").MODEL
    m = measure_wrappers(model, microbatch=1, repeats=1)
    keys = {"plain_fwd_bwd", "fully_shard_fwd_bwd", "fully_shard_no_reshard_fwd_bwd",
            "replicate_fwd_bwd", "plain_adam", "fully_shard_adam"}  # fmt: skip
    assert keys <= set(m) and all(m[k] > 0 for k in keys)
    assert m["tensors"] == 52 and m["units"] == 5  # 4 GPT-2 blocks + the root
    # the per-unit / per-tensor figures are the clipped differences of the raw ones
    assert m["fsdp_unit"] == pytest.approx(
        max(0.0, m["fully_shard_fwd_bwd"] - m["plain_fwd_bwd"]) / 5
    )
    assert m["adam_dtensor"] == pytest.approx(
        max(0.0, m["fully_shard_adam"] - m["plain_adam"]) / 52
    )
    assert not dist.is_initialized()  # the group is torn down
    load_script("measure_dp_wrappers").main(["--repeats", "1", "--microbatch", "1"])
    out = capsys.readouterr().out
    assert "fully_shard_fwd_bwd" in out and "52 parameter tensors" in out


def test_bad_arguments_are_refused(capsys) -> None:
    mod = load_script("measure_dp_wrappers")
    with pytest.raises(SystemExit) as stop:  # argparse's error line, exit status 2
        mod.main(["--repeats", "0"])
    assert stop.value.code == 2
    assert "argument --repeats: expected an integer >= 1, got '0'" in capsys.readouterr().err
