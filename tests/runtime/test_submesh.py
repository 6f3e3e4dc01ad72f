"""Hybrid plans whose pipeline stages run on submeshes of their own (runtime.submesh): rank
order, the messages that re-shard a microbatch between stages of different dp x tp, the
schedules, and executions equal to one full-batch process within 1e-5 (4 and 5 gloo ranks)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.cpu_cluster import cpu_cluster
from graphs.layout import HybridLayout
from graphs.plan import Plan
from runtime.execute import run_specs
from runtime.hybrid import HybridRunner, HybridSpec
from runtime.launch import spawn
from runtime.model import graph_for_model
from runtime.spec import make_run_spec
from runtime.submesh import Piece, boundary_pieces, posting_groups, stage_actions
from tests.runtime import _hybrid_workers
from tests.runtime._reference import TINY, check_grads


def gpt2(n_layer: int = 2, batch: int = 4) -> dict:
    return {"name": "gpt2", "config": dict(TINY, n_layer=n_layer, batch=batch)}


LLAMA = {
    "name": "llama",
    "config": {"batch": 4, "seq": 8, "n_layer": 2, "d_model": 16, "n_head": 4, "n_kv_head": 2,
               "d_ff": 32, "vocab": 32, "n_ctx": 8},
}  # fmt: skip


def spec(meshes, *, mbs: int = 1, gb: int = 4, n_layer: int = 2, **kw) -> HybridSpec:
    """Equal layer ranges, stage p on ``meshes[p]``."""
    pp = len(meshes)
    per = n_layer // pp
    return HybridSpec(
        dp=meshes[0][0], tp=meshes[0][1], pp=pp, microbatch_size=mbs, global_batch=gb,
        stage_layers=tuple((p * per, (p + 1) * per) for p in range(pp)),
        stage_meshes=tuple(meshes), **kw,
    )  # fmt: skip


# ---------------------------------------------------------------------------- no processes
def test_rank_order_round_trip_and_refusals():
    lay = spec([(2, 1), (1, 2), (3, 2)], mbs=3, gb=6, n_layer=3)
    assert lay.world_size == 2 + 2 + 6 and lay.num_microbatches == 1
    assert [lay.coords(r) for r in (0, 1, 2, 3, 4, 9)] == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1), (2, 0, 0), (2, 2, 1),
    ]  # fmt: skip
    assert all(lay.rank(*lay.coords(r)) == r for r in range(lay.world_size))
    assert list(lay.stage_ranks(2)) == list(range(4, 10))
    assert lay.to_dict()["stage_meshes"] == [[2, 1], [1, 2], [3, 2]]
    assert HybridSpec.from_layout(lay.to_dict()) == lay
    uniform = HybridSpec(dp=2, tp=1, pp=2, microbatch_size=1, global_batch=4,
                         stage_layers=((0, 1), (1, 2)))  # fmt: skip
    assert "stage_meshes" not in uniform.to_dict() and uniform.meshes == ((2, 1), (2, 1))
    # from the planner's layout (graphs.layout.HybridLayout) as the runtime receives it
    hl = HybridLayout(dp=2, tp=1, pp=2, microbatch_size=1, global_batch=4,
                      stage_layers=((0, 1), (1, 2)), stage_meshes=((2, 1), (1, 2)))  # fmt: skip
    got = HybridSpec.from_layout(hl)
    assert got.stage_meshes == ((2, 1), (1, 2)) and got.world_size == 4
    assert [got.coords(r) for r in range(4)] == [hl.coords(r) for r in range(4)]
    got.validate(2)
    bad = [
        (dict(meshes=[(1, 2), (2, 1)]), r"stage_meshes\[0\] = \[1, 2\]: expected \(dp, tp\) = \(2, 1\)"),
        (dict(meshes=[(2, 1), (3, 1)]), r"stage_meshes\[1\] = \[3, 1\]: expected a dp that divides"),
        (dict(meshes=[(2, 1)] * 3), r"stage_meshes = .*: expected pp = 2"),
    ]  # fmt: skip
    for kw, match in bad:
        lay = spec([(2, 1), (1, 2)])
        fields = lay.to_dict() | {"stage_meshes": kw["meshes"]}
        with pytest.raises(ValueError, match=match):
            HybridSpec.from_layout(fields).validate(2)
    with pytest.raises(ValueError, match="sequence_parallel=True needs tp > 1"):
        spec([(2, 1), (1, 1)], sequence_parallel=True).validate(2)
    with pytest.raises(ValueError, match="virtual_stages"):
        HybridSpec.from_layout(
            spec([(2, 1), (1, 2)], n_layer=4).to_dict()
            | {"virtual_stages": 2, "schedule": "interleaved",
               "stage_layers": [[0, 1], [1, 2], [2, 3], [3, 4]]}
        ).validate(4)  # fmt: skip
    # the pipelining runner runs one submesh shape and says which runner runs the rest
    with pytest.raises(ValueError, match="SubmeshRunner"):
        HybridRunner(None, None, [], spec([(2, 1), (1, 2)]), rank=0, world_size=4)  # type: ignore[arg-type]


def test_pieces_of_a_microbatch_of_six_rows_from_three_ranks_to_two():
    """dp 3 -> dp 2 (6 rows: 2 per sending rank, 3 per receiving one), by hand; stage 0 is
    ranks 0-2, stage 1 ranks 3-4. A value without a batch dimension goes whole from the rank
    that holds the receiver's first row, and has no gradient message."""
    lay = spec([(3, 1), (2, 1)], mbs=2, gb=12)
    fwd, bwd = boundary_pieces(lay, 0, [True, False])
    assert fwd == [
        Piece(0, 0, 3, 0, 2), Piece(0, 1, 3, 2, 3), Piece(0, 1, 4, 3, 4), Piece(0, 2, 4, 4, 6),
        Piece(1, 0, 3, -1, -1), Piece(1, 1, 4, -1, -1),
    ]  # fmt: skip
    assert bwd == [Piece(0, 3, 0, 0, 2), Piece(0, 3, 1, 2, 3), Piece(0, 4, 1, 3, 4),
                   Piece(0, 4, 2, 4, 6)]  # fmt: skip


def test_pieces_between_tensor_parallel_groups_of_different_size():
    """(dp 1, tp 2) -> (dp 2, tp 1), 2 rows: each receiver takes its row from tp rank
    ``t' mod 2 = 0`` of the sender; each of the two sending tp ranks gets both rows'
    gradients, one from each receiver (ranks 2 and 3). With equal dp, whole tensors go from
    ``(d, t' mod tp)`` to ``(d, t')``."""
    lay = spec([(1, 2), (2, 1)], mbs=2, gb=4)
    fwd, bwd = boundary_pieces(lay, 0, [True])
    assert fwd == [Piece(0, 0, 2, 0, 1), Piece(0, 0, 3, 1, 2)]
    assert bwd == [Piece(0, 2, 0, 0, 1), Piece(0, 3, 0, 1, 2),
                   Piece(0, 2, 1, 0, 1), Piece(0, 3, 1, 1, 2)]  # fmt: skip
    same = spec([(2, 1), (2, 2)])
    fwd, bwd = boundary_pieces(same, 0, [True])
    assert fwd == [Piece(0, 0, 2, -1, -1), Piece(0, 0, 3, -1, -1),
                   Piece(0, 1, 4, -1, -1), Piece(0, 1, 5, -1, -1)]  # fmt: skip
    assert bwd == [Piece(0, 2, 0, -1, -1), Piece(0, 4, 1, -1, -1)]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 12),
    data=st.data(),
)
def test_every_row_crosses_once_each_way(rows, data):
    """Any two neighbouring submeshes: every receiving rank gets every row it computes
    exactly once, from a sending rank that computes that row, and every sending rank gets the
    gradient of every row it computes exactly once, from a receiving rank that computes it."""
    dps, dpr = (data.draw(st.sampled_from(_divisors(rows))) for _ in range(2))
    tps, tpr = (data.draw(st.integers(1, 3)) for _ in range(2))
    lay = HybridSpec(dp=dps, tp=tps, pp=2, microbatch_size=rows // dps, global_batch=rows,
                     stage_layers=((0, 1), (1, 2)), stage_meshes=((dps, tps), (dpr, tpr)))  # fmt: skip
    fwd, bwd = boundary_pieces(lay, 0, [True])
    bs, br = rows // dps, rows // dpr

    def rows_of(piece: Piece, owner_rows: int, d: int) -> range:
        return (
            range(d * owner_rows, (d + 1) * owner_rows)
            if piece.lo < 0
            else range(piece.lo, piece.hi)
        )

    def received(pieces: list[Piece], stage: int) -> Counter:
        """``(receiving rank, row)`` counts of messages into ``stage``, each row checked to
        be computed by both the sending and the receiving rank."""
        got: Counter = Counter()
        for pc in pieces:
            src, dst = lay.coords(pc.src), lay.coords(pc.dst)
            assert (src[0], dst[0]) == (1 - stage, stage)
            ds, dr = (src[1], dst[1]) if stage == 1 else (dst[1], src[1])
            for row in rows_of(pc, (bs, br)[stage], dst[1]):
                assert ds * bs <= row < (ds + 1) * bs and dr * br <= row < (dr + 1) * br
                got[(pc.dst, row)] += 1
        return got

    def every_row_once(stage: int, n_dp: int, n_tp: int, b: int) -> Counter:
        return Counter(
            {(lay.rank(stage, d, t), row): 1 for d in range(n_dp) for t in range(n_tp)
             for row in range(d * b, (d + 1) * b)}
        )  # fmt: skip

    assert received(fwd, 1) == every_row_once(1, dpr, tpr, br)
    assert received(bwd, 0) == every_row_once(0, dps, tps, bs)


def test_schedules_by_hand_and_their_invariants():
    assert stage_actions("1f1b", 0, 3, 4) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3),
    ]  # fmt: skip
    assert stage_actions("1f1b", 2, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert stage_actions("gpipe", 1, 3, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    for sched in ("gpipe", "1f1b"):
        for pp in range(1, 5):
            for p in range(pp):
                for m in range(1, 7):
                    acts = stage_actions(sched, p, pp, m)
                    assert sorted(acts) == sorted(
                        [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
                    )
                    assert all(acts.index(("F", i)) < acts.index(("B", i)) for i in range(m))
                    if sched == "1f1b":  # at most pp - p microbatches in flight
                        live = 0
                        for kind, _ in acts:
                            live += 1 if kind == "F" else -1
                            assert live <= pp - p


@st.composite
def _layouts(draw):
    """2-4 stages on random submeshes (every dp dividing the microbatch), 1-5 microbatches,
    GPipe or 1F1B."""
    rows = draw(st.sampled_from([1, 2, 4, 6, 12]))
    pp = draw(st.integers(2, 4))
    meshes = [(draw(st.sampled_from(_divisors(rows))), draw(st.integers(1, 2))) for _ in range(pp)]
    m = draw(st.integers(1, 5))
    return HybridSpec(
        dp=meshes[0][0], tp=meshes[0][1], pp=pp, microbatch_size=rows // meshes[0][0],
        global_batch=rows * m, stage_layers=tuple((q, q + 1) for q in range(pp)),
        stage_meshes=tuple(meshes), schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
    )  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(lay=_layouts(), majors=st.lists(st.booleans(), min_size=1, max_size=3))
def test_neighbours_post_their_messages_in_one_order(lay, majors):
    """What a step posts (``posting_groups``), for any submeshes, schedule and microbatch
    count: every message is posted once by its sender and once by its receiver, a receive
    is posted before or with the action that needs it and a send after the action that makes
    it, and no two messages between two ranks are posted in opposite orders by the two (a
    pair may only be swapped inside one ``batch_isend_irecv`` group on both sides): what
    NCCL needs not to hang. Value 0 is batch-major, as a hidden state always is."""
    pieces = [boundary_pieces(lay, q, [True, *majors]) for q in range(lay.pp - 1)]
    M = lay.num_microbatches
    posted: dict[tuple, dict[str, int]] = {}
    for rank in range(lay.world_size):
        p = lay.coords(rank)[0]
        acts = stage_actions(lay.schedule, p, lay.pp, M)
        groups = posting_groups(lay, pieces, rank)
        assert len(groups) == len(acts) + 1
        for g, group in enumerate(groups):
            for msg in group:
                key = (msg.kind, msg.mb, msg.piece)
                assert msg.op not in posted.setdefault(key, {}), key  # once per side
                posted[key][msg.op] = g
                i = acts.index((msg.kind, msg.mb))
                # a receive comes with its action (group i), a send right after it (group i + 1)
                assert rank == (msg.piece.dst if msg.op == "recv" else msg.piece.src)
                assert g == (i if msg.op == "recv" else i + 1)
    expected = {(k, mb, pc) for q in range(lay.pp - 1) for k, ps in zip("FB", pieces[q])
                for pc in ps for mb in range(M)}  # fmt: skip
    assert set(posted) == expected and all(len(v) == 2 for v in posted.values())
    by_pair: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (_, _, pc), g in posted.items():
        by_pair.setdefault(tuple(sorted((pc.src, pc.dst))), []).append(
            (g["send"], g["recv"]) if pc.src < pc.dst else (g["recv"], g["send"])
        )
    for pair, gs in by_pair.items():
        for a1, b1 in gs:
            for a2, b2 in gs:
                assert not (a1 < a2 and b1 > b2), (pair, (a1, b1), (a2, b2))


# ---------------------------------------------------------------------------- processes
@pytest.mark.timeout(600)
def test_plans_on_two_submesh_shapes_equal_one_process():
    """4 gloo ranks, one torchrun launch through ``make_run_spec`` (the path of
    ``runners.execute``), GPT-2 with 2 blocks on two stages: (dp 2, tp 1) then (dp 1, tp 2)
    under ZeRO 3 with full recomputation on GPipe; (dp 1, tp 2) with sequence parallelism
    then (dp 2, tp 1), ZeRO 0 then 3 (the tied embedding replicated on one stage and sharded
    on the other), 1F1B. The loss and every gradient of the first step equal one full-batch
    process within 1e-5."""
    graph = graph_for_model(gpt2())
    cluster = cpu_cluster(4, calibration={})
    cases = [
        dict(dp=2, tp=1, microbatch_size=1, stage_meshes=((2, 1), (1, 2)), zero=3,
             recompute="full", schedule="gpipe"),
        dict(dp=1, tp=2, microbatch_size=2, stage_meshes=((1, 2), (2, 1)),
             sequence_parallel=True, zero=0, stage_zero=(0, 3)),
    ]  # fmt: skip
    specs = []
    for kw in cases:
        plan = Plan.hybrid(graph, cluster, pp=2, global_batch=4, meta={"model": gpt2()}, **kw)
        sp = make_run_spec(plan, graph, cluster, steps=1, warmup=0, capture_grads=True,
                           timeout_s=300)  # fmt: skip
        assert sp.world_size == 4 and sp.hybrid["stage_meshes"] == [
            list(m) for m in kw["stage_meshes"]
        ]
        specs.append(sp)
    results = run_specs(specs, timeout_s=580)
    for kw, res in zip(cases, results):
        assert (res.mode, res.world_size, res.microbatches) == (
            "hybrid",
            4,
            4 // (kw["dp"] * kw["microbatch_size"]),
        ), kw
        check_grads([res.extra["grads"]], gpt2(), res.loss)


@pytest.mark.timeout(600)
def test_rows_split_unevenly_and_llama_constants_cross_whole():
    """Rows that do not line up: 12 samples in microbatches of 6 rows, (dp 3) -> (dp 2), so
    the second receiving rank takes rows 3-5 from two senders, with ZeRO 3 and selective
    recomputation (5 gloo ranks); then LLaMA, whose rotary tables and causal mask cross the
    boundary without a batch dimension, (dp 2, tp 1) -> (dp 1, tp 2) with sequence parallelism
    and ZeRO 2 on 4 of the ranks' own launch. Loss and gradients equal one process."""
    lay = spec([(3, 1), (2, 1)], mbs=2, gb=12, zero=3, recompute="selective")
    ranks = spawn(_hybrid_workers.observe_steps, 5, ([(lay.to_dict(), gpt2(batch=12))],),
                  timeout_s=280)  # fmt: skip
    check_grads([r[0]["grads"] for r in ranks], gpt2(batch=12), sum(r[0]["loss"] for r in ranks))
    lay = spec([(2, 1), (1, 2)], zero=2, sequence_parallel=True)
    ranks = spawn(_hybrid_workers.observe_steps, 4, ([(lay.to_dict(), LLAMA)],), timeout_s=280)
    check_grads([r[0]["grads"] for r in ranks], LLAMA, sum(r[0]["loss"] for r in ranks))
