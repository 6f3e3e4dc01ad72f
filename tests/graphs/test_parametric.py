"""Parametric GPT / LLaMA graphs and the multi-node DGX presets."""

from __future__ import annotations

import re
import time

import pytest

from graphs import clusters, zoo
from graphs.layout import model_dims


def test_gpt3_175b_builds_fast_with_the_published_parameter_count():
    t0 = time.perf_counter()
    g = zoo.build("gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048)
    assert time.perf_counter() - t0 < 60
    # 12 l h^2 (1 + 13/12h + (V + s)/12lh) = 174.6e9 (Narayanan et al. 2021 eq. 2 form)
    h, L, V, s = 12288, 96, 51200, 2048
    # plus the final LayerNorm (2h), which the formula leaves out
    want = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h)) + 2 * h
    assert g.num_params == pytest.approx(want, rel=1e-9)
    assert g.num_params == pytest.approx(174.6e9, rel=1e-3)
    assert int(g.layer.max()) + 1 == 96
    d = model_dims(g)
    # forward FLOPs per token: 24 h^2 + 4 s h per layer + 2 h V for the head
    assert d.layer_flops(1) == pytest.approx(24 * h * h + 4 * s * h)


def test_llama2_70b_dims_and_parameters():
    g = zoo.build(
        "llama", hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=32000, seq=4096
    )
    d = model_dims(g)
    assert (d.arch, d.kv_heads, d.tied) == ("llama", 8, False)
    assert g.num_params == pytest.approx(68.98e9, rel=1e-3)  # Llama 2 70B: 68,976,648,192


def test_trillion_parameter_model_of_128_layers():
    t0 = time.perf_counter()
    g = zoo.build("gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048)
    assert time.perf_counter() - t0 < 60
    assert g.num_params == pytest.approx(1008e9, rel=2e-3)


def test_parametric_keys_are_checked():
    with pytest.raises(ValueError, match="ffns"):
        zoo.build("gpt", hidden=64, layers=2, heads=4, vocab=10, seq=8, ffns=3)
    with pytest.raises(ValueError, match="needs"):
        zoo.build("gpt", hidden=64, layers=2)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"hidden": "abc"}, "hidden = 'abc'; expected an integer"),
        ({"hidden": "1024"}, "hidden = '1024'; expected an integer"),  # int() would read it
        ({"hidden": 1600.5}, "hidden = 1600.5; expected an integer"),  # int() would truncate
        ({"layers": True}, "layers = True; expected an integer"),
        ({"batch": "8"}, "batch = '8'; expected an integer"),
    ],
)
def test_parametric_dimensions_must_be_integers(kw, message):
    base = dict(hidden=64, layers=2, heads=4, vocab=128, seq=16)
    with pytest.raises(ValueError, match=re.escape(message)):
        zoo.build("gpt", **{**base, **kw})
    with pytest.raises(ValueError, match=re.escape("tied = 'false'; expected true or false")):
        zoo.build("llama", **base, kv_heads=4, tied="false")  # bool('false') is True
    assert zoo.build("gpt", **{**base, "hidden": 64.0}).meta["model_dims"]["hidden"] == 64


def test_dgx_presets_scale_to_many_nodes():
    cl = clusters.load("dgx_a100_80g", nodes=4)
    assert cl.num_devices == 32 and cl.meta["gpus_per_node"] == 8 and cl.meta["nodes"] == 4
    assert cl.devices[9].name == "gpu9"
    # inside a node: NVSwitch, 300 GB/s per direction; across nodes one 25 GB/s HDR NIC
    assert cl.transfer_time(0, 1, 300e9) == pytest.approx(1 + 2e-6)
    assert cl.transfer_time(0, 9, 25e9) == pytest.approx(1 + 5e-6)
    h = clusters.load("dgx_h100", nodes=2)
    assert h.transfer_time(0, 15, 50e9) == pytest.approx(1 + 5e-6)
    assert h.devices[0].peak_flops == 989e12
    big = clusters.load("dgx_h100", nodes=768)
    assert big.num_devices == 6144
    with pytest.raises(ValueError, match="multi-node"):
        clusters.load("dgx1_v100_8", nodes=2)
    # a bound, not minutes of building (100,000 nodes) or the machine's memory (10**9)
    for name, kw in (("dgx_h100", {"nodes": 10**9}), ("dgx_a100_80g_x5000", {})):
        with pytest.raises(ValueError, match="nodes must be at most 4,096"):
            clusters.load(name, **kw)
    # a numpy integer (a grid's node count) is an integer: "must be an integer ... got
    # np.int64(2)" before (2 Dec 2026); an integral float is still not
    import numpy as np

    assert clusters.load("dgx_h100", nodes=np.int64(2)).num_devices == 16
    for bad in (2.0, True, "2"):
        with pytest.raises(ValueError, match="nodes must be an integer >= 1"):
            clusters.load("dgx_h100", nodes=bad)


def test_leonardo_booster_preset_has_four_gpus_per_node_and_direct_nvlink():
    cl = clusters.load("leonardo_booster", nodes=63)  # the open-sci-ref run's 252 GPUs
    assert cl.num_devices == 252 and cl.meta["gpus_per_node"] == 4
    assert cl.devices[0].memory == 64 * 2**30 and cl.devices[0].peak_flops == 312e12
    # a direct 100 GB/s/dir route between two GPUs of a node (1 us), 12.5 GB/s HDR100 between
    # nodes through the fabric switch (two 2.5 us hops)
    assert cl.transfer_time(0, 3, 100e9) == pytest.approx(1 + 1e-6)
    assert cl.transfer_time(0, 4, 12.5e9) == pytest.approx(1 + 5e-6)
    assert clusters.load("leonardo_booster_x2").num_devices == 8


def test_dropout_and_grad_bytes_keywords_are_checked_and_round_trip():
    from graphs.layout import dims_from_mapping

    base = dict(hidden=64, layers=2, heads=4, vocab=128, seq=16)
    with pytest.raises(ValueError, match=re.escape("grad_bytes = '4'; expected a number")):
        zoo.build("gpt", **base, grad_bytes="4")
    with pytest.raises(ValueError, match=re.escape("grad_bytes = 0; expected a number")):
        zoo.build("gpt", **base, grad_bytes=0)
    with pytest.raises(ValueError, match=re.escape("dropout = 'yes': expected true, false")):
        zoo.build("llama", **base, dropout="yes")
    # the architecture's default is not written (graphs built before keep their hash)
    assert "dropout" not in zoo.build("gpt", **base).meta["model_dims"]
    assert "dropout" not in zoo.build("llama", **base, dropout=False).meta["model_dims"]
    g = zoo.build("llama", **base, dropout=True, grad_bytes=4.0)
    d = model_dims(g)
    assert d.dropout and g.meta["grad_bytes_per_param"] == 4.0
    assert dims_from_mapping(d.to_dict()) == d
    assert model_dims(zoo.build("gpt", **base)).dropout


# ---------------------------------------------------------------------------- PyTorch modules
@pytest.mark.parametrize(
    "name, cfg",
    [
        ("gpt", dict(hidden=64, layers=4, heads=4, vocab=512, seq=32, batch=8)),
        ("gpt", dict(hidden=1024, layers=3, heads=16, vocab=51200, seq=1024, batch=16,
                     flash_attention=True, grad_bytes=4)),  # memory-only keys are ignored
        ("llama", dict(hidden=64, layers=4, heads=4, kv_heads=2, ffn=96, vocab=512, seq=32)),
        ("llama", dict(hidden=96, layers=2, heads=6, ffn=256, vocab=1000, seq=16, batch=4)),
    ],
)  # fmt: skip
def test_module_spec_builds_the_module_the_parametric_graph_counts(name, cfg):
    """A parametric model runs on the zoo's GPT-2 / LLaMA module of its dimensions: the same
    parameters (count and per-layer split), one block per layer, the batch and sequence of
    the graph (``runners.execute`` runs hybrid plans of it)."""
    from graphs.zoo.parametric import dims_from_kwargs, module_spec
    from runtime.hybrid import block_list
    from runtime.model import load_model
    from runtime.program import export_with_loss

    dims = dims_from_kwargs(name, dict(cfg))
    spec = module_spec(name, cfg)
    assert spec["name"] == {"gpt": "gpt2", "llama": "llama"}[name]
    zm = load_model({"name": name, "config": cfg}, device="meta")
    assert type(zm.module).__name__ == {"gpt": "GPT2", "llama": "Llama"}[name]
    params = dict(zm.module.named_parameters())
    assert sum(p.numel() for p in params.values()) == dims.num_params()
    assert zoo.build(name, **cfg).num_params == pytest.approx(dims.num_params(), rel=1e-12)
    blocks = "h" if name == "gpt" else "layers"
    per_layer = sum(p.numel() for n, p in params.items() if n.startswith(f"{blocks}.0."))
    assert per_layer == dims.layer_params()
    assert tuple(zm.example_inputs[0].shape) == (dims.batch, dims.seq)
    mb = tuple(x[:1] for x in zm.example_inputs)
    assert block_list(export_with_loss(zm.module, mb, zm.loss_fn)) == (blocks, dims.layers)


def test_module_spec_refuses_shapes_no_module_has_naming_the_key():
    from graphs.zoo.parametric import module_spec

    base = dict(hidden=64, layers=2, heads=4, vocab=512, seq=32)
    with pytest.raises(ValueError, match=r"'gpt' with ffn = 100 .* 4 x hidden = 256"):
        module_spec("gpt", dict(base, ffn=100))
    with pytest.raises(ValueError, match="'llama' with tied = true"):
        module_spec("llama", dict(base, tied=True))
    with pytest.raises(ValueError, match=r"needs \['seq'\]"):  # zoo.build's own checks
        module_spec("gpt", {k: v for k, v in base.items() if k != "seq"})
    assert module_spec("gpt", dict(base, ffn=256))["config"]["n_layer"] == 2


def test_content_hash_tells_apart_models_that_differ_only_in_their_dimensions_meta() -> None:
    # FlashAttention changes only meta["model_dims"] (the hybrid model's activation memory:
    # 1.9 against 3.3 GB here); until 29 Nov 2026 both graphs had one hash
    kw = dict(hidden=1024, layers=4, heads=16, vocab=32000, seq=2048, batch=8)
    a, b = zoo.build("gpt", **kw), zoo.build("gpt", **kw, flash_attention=True)
    assert (a.flops == b.flops).all() and a.content_hash() != b.content_hash()
    assert zoo.build("gpt", **kw).content_hash() == a.content_hash()
