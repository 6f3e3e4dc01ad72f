"""Failure handling and many hosts: a rank that hangs is named (runtime.watchdog) on one host and
across two torchrun launches joined by a c10d rendezvous (runtime.multinode); a hybrid plan run
as two hosts equals one process."""

from __future__ import annotations

import re
import time

import pytest

from runtime import launch
from runtime.execute import run_specs
from runtime.hybrid import HybridSpec
from runtime.launch import RankFailure
from runtime.multinode import node_command, run_specs_multinode
from runtime.spec import RunSpec
from runtime.watchdog import RankState, describe, suspects
from tests.runtime._reference import TINY, check_grads

MODEL = {"name": "gpt2", "config": dict(TINY, n_layer=2)}
HANG_S = 8.0


def spec(dp: int, pp: int, **kw) -> RunSpec:
    """dp x pp hybrid run of the 2-block GPT-2 (one block per pipeline rank)."""
    lay = HybridSpec(
        dp=dp, tp=1, pp=pp, microbatch_size=1, global_batch=4,
        stage_layers=((0, 1), (1, 2)) if pp == 2 else ((0, 2),),
    )  # fmt: skip
    return RunSpec(
        mode="hybrid", world_size=lay.world_size, devices=list(range(lay.world_size)),
        model=MODEL, hybrid=lay.to_dict(), microbatches=lay.num_microbatches, steps=2,
        warmup=0, hang_timeout_s=HANG_S, timeout_s=120, **kw,
    )  # fmt: skip


# ---------------------------------------------------------------------------- no processes
def st(rank, pulse, beat, comm, where="x.py:1 f"):
    return RankState(rank, pulse, beat, 1, "forward/backward", comm, where)


def test_suspects_blame_the_rank_idle_outside_communication_or_silent():
    now = 100.0
    waiting = [st(0, 99.5, 80.0, True), st(2, 99.8, 85.0, True)]
    busy = st(1, 99.9, 70.0, False, "worker.py:134 inject_fault")
    assert suspects([*waiting, busy], now, 8.0) == [busy]
    assert describe(busy, now, 8.0) == (
        "rank 1 hangs: made no progress for 30 s outside communication in step 1 "
        "(forward/backward) at worker.py:134 inject_fault"
    )
    frozen = st(3, 60.0, 60.0, True)  # its watchdog thread stopped answering
    assert suspects([*waiting, frozen], now, 8.0) == [frozen]
    assert "stopped responding (no heartbeat for 40 s)" in describe(frozen, now, 8.0)
    # everyone waits on communication (a mismatched collective): the least recent progress
    assert suspects(waiting, now, 8.0) == [waiting[0]]
    # a slow but progressing rank is not blamed
    assert suspects([st(0, 99.9, 95.0, False), st(1, 99.9, 99.0, True)], now, 8.0) == []


def test_node_command_is_a_c10d_rendezvous_torchrun():
    cmd = node_command(
        "s.json", "out", nnodes=2, nproc_per_node=4, rdzv_endpoint="h0:29400", rdzv_id="j1"
    )
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    for arg in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                "--rdzv-endpoint=h0:29400", "--rdzv-id=j1", "--max-restarts=0"):  # fmt: skip
        assert arg in cmd
    assert cmd[-6:] == ["-m", "runtime.worker", "--spec", "s.json", "--out", "out"]


def test_fault_is_checked():
    with pytest.raises(ValueError, match="RunSpec.fault"):
        spec(1, 2, fault={"rank": 5, "kind": "hang"}).validate()


# ---------------------------------------------------------------------------- processes
def _assert_names_hang(err: RankFailure, rank: int) -> None:
    assert (err.rank, err.error_type) == (rank, "RankHang"), str(err)
    m = re.search(
        rf"rank {rank} hangs: made no progress for (\d+) s outside communication", str(err)
    )
    assert m and HANG_S <= int(m.group(1)) <= HANG_S + 4, str(err)
    assert "inject_fault" in str(err)  # where it hangs


@pytest.mark.timeout(300)
def test_a_rank_that_hangs_ends_the_job_naming_it_one_host():
    """2 ranks (pp 2) on one host: rank 1 sleeps for good before step 1; both watchdogs name it
    after HANG_S and the job ends, long before the 120 s process-group timeout."""
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_specs([spec(1, 2, fault={"rank": 1, "step": 1, "kind": "hang"})], timeout_s=280)
    _assert_names_hang(info.value, 1)
    assert time.monotonic() - t0 < 100  # launch + build + 1 step + HANG_S + teardown


@pytest.mark.timeout(300)
def test_a_rank_that_hangs_ends_the_job_naming_it_across_two_hosts():
    """Two torchrun launches of one rank each (c10d rendezvous on localhost): rank 0 hangs,
    both hosts end and the error names rank 0."""
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_specs_multinode(
            [spec(1, 2, fault={"rank": 0, "step": 1, "kind": "hang"})], 2, timeout_s=280
        )
    _assert_names_hang(info.value, 0)
    assert all(c is not None and c != 0 for c in info.value.exit_codes)  # both hosts ended
    assert time.monotonic() - t0 < 100


needs_issue15 = pytest.mark.skipif(
    not hasattr(launch, "first_failure"),
    reason="naming a rank that died without a record needs runtime.launch.first_failure (issue 15)",
)


@needs_issue15
@pytest.mark.timeout(300)
def test_a_rank_that_dies_ends_the_job_naming_it_across_two_hosts():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_specs_multinode(
            [spec(1, 2, fault={"rank": 1, "step": 1, "kind": "die"})], 2, timeout_s=280
        )
    assert info.value.rank == 1 and "signal 9" in str(info.value), str(info.value)
    assert time.monotonic() - t0 < 100


@pytest.mark.timeout(400)
def test_hybrid_plan_on_two_hosts_equals_one_process(tmp_path):
    """dp 2 x pp 2 as two launches of two ranks: each host holds one pipeline stage (rank =
    p * dp + d), so activations cross "hosts"; then, in the same launches, pp 4 over a
    4-block model (ranks 1 and 2 hold neither end of the tied embedding / LM head). Loss and
    every gradient within 1e-5."""
    pp4 = HybridSpec(
        dp=1, tp=1, pp=4, microbatch_size=1, global_batch=4,
        stage_layers=((0, 1), (1, 2), (2, 3), (3, 4)),
    )  # fmt: skip
    model4 = {"name": "gpt2", "config": dict(TINY, n_layer=4)}
    specs = [
        spec(2, 2, capture_grads=True),
        RunSpec(
            mode="hybrid", world_size=4, devices=[0, 1, 2, 3], model=model4,
            hybrid=pp4.to_dict(), microbatches=4, steps=1, warmup=0, capture_grads=True,
        ),
    ]  # fmt: skip
    res = run_specs_multinode(specs, 2, timeout_s=380, out_dir=tmp_path)
    check_grads([res[0].extra["grads"]], MODEL, res[0].loss)
    check_grads([res[1].extra["grads"]], model4, res[1].loss)
    assert (tmp_path / "node0" / "command.txt").read_text().count("--nnodes=2") == 1
    ranks = sorted(p.name for p in tmp_path.glob("node*/rank*.json"))
    assert ranks == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
