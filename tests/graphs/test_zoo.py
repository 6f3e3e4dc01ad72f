"""Tests for graphs.zoo: every model builds on tiny configs, modules run, the cache works."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from graphs import zoo
from graphs.compgraph import BWD, FWD, OPT

TINY: dict[str, dict] = {
    "gpt2": dict(n_layer=1, d_model=32, n_head=2, vocab=50, batch=2, seq=8),
    "gpt2-medium": dict(n_layer=1, d_model=32, n_head=2, vocab=50, batch=2, seq=8),
    "gpt2-large": dict(n_layer=1, d_model=32, n_head=2, vocab=50, batch=2, seq=8),
    "gpt2-xl": dict(n_layer=1, d_model=32, n_head=2, vocab=50, batch=2, seq=8),
    "bert-base": dict(n_layer=1, d_model=32, n_head=2, d_ff=64, vocab=50, batch=2, seq=8),
    "bert-large": dict(n_layer=1, d_model=32, n_head=2, d_ff=64, vocab=50, batch=2, seq=8),
    "llama": dict(n_layer=1, d_model=32, n_head=4, n_kv_head=2, d_ff=64, vocab=50, batch=2, seq=8),
    "mixtral": dict(
        n_layer=1, d_model=32, n_head=4, n_kv_head=2, d_ff=64, vocab=50, n_expert=4, batch=2, seq=8
    ),
    "resnet50": dict(blocks=(1, 1), width=4, num_classes=5, image_size=32, batch=2),
    "vit-base": dict(
        n_layer=1, d_model=32, n_head=2, d_ff=64, image_size=16, patch=8, num_classes=5, batch=2
    ),  # fmt: skip
    "inception-v3": dict(width=0.0625, image_size=75, num_classes=5, batch=2),
    "rnnlm": dict(vocab=50, d_model=16, batch=2, seq=3),
    "nmt": dict(vocab=50, d_model=16, batch=2, seq=3),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_names_and_unknown() -> None:
    assert sorted(zoo.names()) == sorted(TINY)
    with pytest.raises(ValueError, match="unknown model 'gpt3'.*gpt2-xl"):
        zoo.build("gpt3")
    with pytest.raises(ValueError, match="no config key.*'n_layers'.*valid keys"):
        zoo.build("gpt2", n_layers=2)
    with pytest.raises(ValueError, match="takes images"):
        zoo.build("resnet50", seq=3)


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_model_builds_a_training_graph(name: str) -> None:
    g = zoo.build(name, cache=False, **TINY[name])
    zm = zoo.build_module(name, **TINY[name])
    n_params = sum(p.numel() for p in zm.module.parameters())  # parameters() dedups tied weights
    assert g.num_params == pytest.approx(n_params)
    assert (g.kind == FWD).sum() > 5 and (g.kind == BWD).sum() > 5 and (g.kind == OPT).sum() > 0
    assert g.meta["name"] == name and g.meta["batch"] == TINY[name]["batch"]
    assert g.meta["unknown_ops"] == []
    assert g.total_flops(FWD) > 0 and g.act_bytes.sum() > 0
    # the real module runs and trains with the same config
    loss = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()


def test_forward_names_match_export_of_real_module() -> None:
    from graphs.extraction import export_program

    zm = zoo.build_module("gpt2", **TINY["gpt2"])
    ep = export_program(zm.module, zm.example_inputs, zm.loss_fn)
    fx = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    g = zoo.build("gpt2", cache=False, **TINY["gpt2"])
    fwd = [g.name[i] for i in np.flatnonzero(g.kind == FWD)]
    assert set(fwd) <= set(fx)
    assert [x for x in fx if x in set(fwd)] == fwd  # same order


def test_gpt2_flops_close_to_analytic_on_small_config() -> None:
    # n_ctx = seq: unused position embeddings would inflate 2 * params * tokens
    g = zoo.build(
        "gpt2", cache=False, n_layer=2, d_model=64, n_head=4, vocab=500, n_ctx=32, batch=2, seq=32
    )
    ratio = g.total_flops(FWD) / zoo.analytic_flops("gpt2", g)
    assert 0.9 < ratio < 1.1


def test_mixtral_routes_top2_of_experts() -> None:
    cfg = dict(TINY["mixtral"], n_expert=8, top_k=2, d_ff=128)
    g = zoo.build("mixtral", cache=False, **cfg)
    expert = [i for i in range(g.num_nodes) if g.kind[i] == FWD and ".experts." in g.module[i]]
    mm = [i for i in expert if g.flops[i] > 0 and "linear" in g.name[i]]
    tokens, cap = 16, 4  # capacity = ceil(1.0 * 2 * 16 / 8)
    assert len(mm) == 8 * 3
    assert sum(g.flops[i] for i in mm) == 8 * 3 * 2 * cap * 32 * 128
    assert tokens * 2 == 8 * cap


def test_cache_roundtrip_and_bypass(_cache: Path) -> None:
    g1 = zoo.build("gpt2", **TINY["gpt2"])
    files = list(_cache.glob("gpt2-*.npz"))
    assert len(files) == 1
    g2 = zoo.build("gpt2", **TINY["gpt2"])
    assert g2.content_hash() == g1.content_hash() and g2.meta == g1.meta
    assert g2.module == g1.module
    zoo.build("gpt2", cache=False, **dict(TINY["gpt2"], seq=4))
    assert len(list(_cache.glob("gpt2-*.npz"))) == 1
    c = zoo.build("gpt2", max_groups=4, **TINY["gpt2"])
    assert c.num_groups <= 4 and np.isclose(c.flops.sum(), g1.flops.sum())
    assert len(list(_cache.glob("gpt2-*.npz"))) == 2


@pytest.mark.slow
def test_gpt2_xl_must_show() -> None:
    g = zoo.build("gpt2-xl", cache=False)
    assert g.meta["batch"] == 8 and g.meta["config"]["seq"] == 1024
    assert abs(g.num_params / 1.56e9 - 1) < 0.01
    assert (g.kind == FWD).sum() >= 800
    assert abs(g.total_flops(FWD) / zoo.analytic_flops("gpt2-xl", g) - 1) < 0.10
    from graphs.coarsening import coarsen

    c = coarsen(g, 256)
    assert c.num_groups <= 256
    for f in ("flops", "bytes_accessed", "param_bytes", "act_bytes"):
        assert np.isclose(getattr(c, f).sum(), getattr(g, f).sum())


def test_cache_key_changes_with_the_extraction_source(tmp_path, monkeypatch) -> None:
    """An edited extractor must never read a graph cached by the old code."""
    import graphs.zoo as zoo_mod

    monkeypatch.setenv("DEVPLACE_CACHE", str(tmp_path))
    cfg = dict(n_layer=1, d_model=32, n_head=2, vocab=50, seq=8, batch=2)
    zoo_mod.build("gpt2", **cfg)
    assert len(list(tmp_path.glob("*.npz"))) == 1
    monkeypatch.setattr(zoo_mod, "SOURCE_DIGEST", "edited-source")
    zoo_mod.build("gpt2", **cfg)
    assert len(list(tmp_path.glob("*.npz"))) == 2  # a new entry, not the stale one


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"n_layer": "abc"}, "config n_layer = 'abc'; expected an integer"),  # was a TypeError
        ({"n_layer": 2.5}, "config n_layer = 2.5; expected an integer"),  # was a TypeError
        ({"n_layer": True}, "config n_layer = True; expected an integer"),  # was 1 layer
        ({"n_layer": 0}, "config n_layer = 0; expected an integer >= 1"),  # was no layer
        ({"d_model": "64"}, "config d_model = '64'; expected an integer"),
        ({"dropout": "x"}, "config dropout = 'x'; expected a number"),
        ({"batch": "4"}, "config batch = '4'; expected an integer"),
        ({"seq": 0}, "config seq = 0; expected an integer >= 1"),
    ],
)
def test_extracted_model_overrides_are_type_checked(kw, message) -> None:
    """An override of an extracted model's config must have its default's type; the error
    names the model and the key (``python -m runners.train +env=gpt2_8gpu
    +env.model_config.n_layer=abc`` used to end in a ``TypeError`` from inside PyTorch)."""
    base = dict(n_layer=2, d_model=64, n_head=2, seq=16, vocab=64)
    with pytest.raises(ValueError, match=f"graphs.zoo: 'gpt2' {message}".replace("(", r"\(")):
        zoo.build("gpt2", cache=False, **{**base, **kw})
    g = zoo.build("gpt2", cache=False, **{**base, "n_layer": 2.0})  # an integral float is fine
    assert g.meta["config"]["n_layer"] == 2 and isinstance(g.meta["config"]["n_layer"], int)


@pytest.mark.parametrize(
    "name, kw, message",
    [
        # found by fuzzing: each was accepted or a torch RuntimeError from inside the trace
        ("inception-v3", {"width": -1.0}, "config width = -1.0; expected a number > 0"),
        ("resnet50", {"blocks": []}, "config blocks = []; expected a non-empty list"),
        ("resnet50", {"blocks": [3, 0]}, "config blocks = [3, 0]; expected a list of integers >= 1"),
        ("mixtral", {"n_expert": 2, "top_k": 4}, "config top_k = 4 is more than n_expert = 2"),
        ("inception-v3", {"image_size": 16},
         "graphs.zoo.build: 'inception-v3' with {'image_size': 16} cannot run on its example "
         "input (batch 32): Calculated padded input size"),
        # batch norm on a 1 x 1 map of one sample: torch's ValueError (not a RuntimeError)
        ("inception-v3", {"image_size": 75, "width": 0.0625, "batch": 1},
         "'inception-v3' with {'image_size': 75, 'width': 0.0625} cannot run on its example "
         "input (batch 1): Expected more than 1 value per channel"),
    ],
)  # fmt: skip
def test_configs_a_model_cannot_run_are_named(name, kw, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        zoo.build(name, cache=False, **kw)


def test_max_groups_must_be_a_whole_number() -> None:
    base = dict(n_layer=1, d_model=32, n_head=2, vocab=64, seq=8)
    for bad in (True, 2.5, "4", 0):  # True was taken as one group
        with pytest.raises(ValueError, match="max_groups must be an integer >= 1 or None"):
            zoo.build("gpt2", max_groups=bad, cache=False, **base)


def test_an_explicit_context_shorter_than_seq_is_refused_not_raised() -> None:
    # until 29 Nov 2026 n_ctx=8 with seq=16 built a 16-position model (57,536 parameters
    # instead of the 57,024 of 8 positions) without a word
    with pytest.raises(ValueError, match=r"n_ctx = 8 is shorter than seq = 16"):
        zoo.build("gpt2", cache=False, n_layer=1, d_model=64, n_head=4, vocab=100, seq=16,
                  batch=1, n_ctx=8)  # fmt: skip
    g = zoo.build("gpt2", cache=False, n_layer=1, d_model=64, n_head=4, vocab=100, seq=16,
                  batch=1, n_ctx=16)  # fmt: skip
    assert g.num_params == 57536  # 12 h^2 + 13 h + V h + 16 h + 2 h, h = 64, V = 100
