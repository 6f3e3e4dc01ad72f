"""Model zoo: named models defined from configs (nothing downloaded), built as modules or training graphs.

``build(name, ...)`` extracts the training graph on meta tensors (cached on disk
under ``$DEVPLACE_CACHE``, default ``~/.cache/devplace/graphs``);
``build_module(name, ...)`` returns the real module, example inputs and loss
function with the same config, so that ``graphs.extraction.export_program`` of it
has the graph's forward node names.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphs.compgraph import CompGraph
from graphs.schema import is_number, is_whole
from graphs.zoo.cache import cache_dir, cache_key, load_npz, save_npz

#: Bumped whenever extraction, coarsening or a model definition changes cached results.
VERSION = "zoo-4"


def _source_digest() -> str:
    """SHA-256 of the code that determines a built graph, so an edited extractor,
    coarsener or model definition never reads a stale cache entry (even without a
    :data:`VERSION` bump)."""
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [
        here.parent / f for f in ("extraction.py", "training.py", "coarsening.py", "compgraph.py")
    ]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


SOURCE_DIGEST = _source_digest()


def lm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: logits at t predict ``idx[:, t + 1]``."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), idx[:, 1:].reshape(-1))


def mlm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Masked-LM style cross-entropy against the input tokens at every position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx.reshape(-1))


def cls_loss(logits: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Image classification cross-entropy against ``target`` class indices."""
    return F.cross_entropy(logits, target)


@dataclass
class ZooModel:
    """A zoo model ready to run: ``loss_fn(module(*example_inputs), *example_inputs)`` is the loss."""

    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    loss_fn: Callable[..., torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """How to make one zoo model: class, default config, input kind, defaults for batch/seq."""

    cls: Callable[..., nn.Module]
    config: dict[str, Any]
    inputs: str  # "tokens", "seq2seq" or "image"
    batch: int
    seq: int | None  # sequence length; None for image models (use image_size)


def _specs() -> dict[str, ModelSpec]:
    from graphs.zoo.rnn import NMT, RNNLM
    from graphs.zoo.transformers import GPT2, Bert, Llama, ViT
    from graphs.zoo.vision import InceptionV3, ResNet

    gpt = dict(vocab=50257, n_ctx=1024)
    return {
        "gpt2": ModelSpec(GPT2, dict(gpt, n_layer=12, d_model=768, n_head=12), "tokens", 8, 1024),
        "gpt2-medium": ModelSpec(
            GPT2, dict(gpt, n_layer=24, d_model=1024, n_head=16), "tokens", 8, 1024
        ),
        "gpt2-large": ModelSpec(
            GPT2, dict(gpt, n_layer=36, d_model=1280, n_head=20), "tokens", 8, 1024
        ),
        "gpt2-xl": ModelSpec(
            GPT2, dict(gpt, n_layer=48, d_model=1600, n_head=25), "tokens", 8, 1024
        ),
        "bert-base": ModelSpec(
            Bert,
            dict(vocab=30522, n_ctx=512, n_layer=12, d_model=768, n_head=12, d_ff=3072),
            "mlm",
            8,
            512,
        ),
        "bert-large": ModelSpec(
            Bert,
            dict(vocab=30522, n_ctx=512, n_layer=24, d_model=1024, n_head=16, d_ff=4096),
            "mlm",
            8,
            512,
        ),
        "llama": ModelSpec(  # LLaMA-7B shape
            Llama,
            dict(
                vocab=32000,
                n_ctx=2048,
                n_layer=32,
                d_model=4096,
                n_head=32,
                n_kv_head=32,
                d_ff=11008,
                n_expert=0,
            ),
            "tokens",
            8,
            2048,
        ),
        "mixtral": ModelSpec(  # Mixtral-8x7B shape
            Llama,
            dict(
                vocab=32000,
                n_ctx=4096,
                n_layer=32,
                d_model=4096,
                n_head=32,
                n_kv_head=8,
                d_ff=14336,
                n_expert=8,
                top_k=2,
                capacity_factor=1.0,
                rope_theta=1e6,
            ),
            "tokens",
            8,
            2048,
        ),
        "resnet50": ModelSpec(
            ResNet,
            dict(blocks=(3, 4, 6, 3), width=64, num_classes=1000, image_size=224),
            "image",
            64,
            None,
        ),
        "vit-base": ModelSpec(
            ViT,
            dict(
                image_size=224,
                patch=16,
                n_layer=12,
                d_model=768,
                n_head=12,
                d_ff=3072,
                num_classes=1000,
            ),
            "image",
            64,
            None,
        ),
        "inception-v3": ModelSpec(
            InceptionV3, dict(num_classes=1000, width=1.0, image_size=299), "image", 32, None
        ),
        "rnnlm": ModelSpec(RNNLM, dict(vocab=10000, n_layer=2, d_model=2048), "tokens", 64, 20),
        "nmt": ModelSpec(NMT, dict(vocab=32000, n_layer=2, d_model=1024), "seq2seq", 64, 40),
    }


_SPECS: dict[str, ModelSpec] | None = None


def _spec(name: str) -> ModelSpec:
    global _SPECS
    if _SPECS is None:
        _SPECS = _specs()
    if name not in _SPECS:
        raise ValueError(f"graphs.zoo: unknown model {name!r}; choose one of {names()}")
    return _SPECS[name]


def names() -> list[str]:
    """Names of the zoo models."""
    return [
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "llama",
        "mixtral", "resnet50", "vit-base", "inception-v3", "rnnlm", "nmt",
    ]  # fmt: skip


def _check_config_value(name: str, key: str, value: Any, default: Any) -> None:
    """Refuse an override whose type differs from the default's, naming the key: an integer
    size (>= 1 where the default is), a finite number, a boolean, or a sequence."""

    def bad(expected: str) -> ValueError:
        return ValueError(f"graphs.zoo: {name!r} config {key} = {value!r}; expected {expected}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif isinstance(default, int):
        if not is_whole(value, floats=True):
            raise bad("an integer")
        if default >= 1 and value < 1:
            raise bad("an integer >= 1")
    elif isinstance(default, float):
        if not is_number(value):  # finite, never a bool
            raise bad("a number")
        if default > 0 and value <= 0:  # a width multiplier, a capacity factor (fuzzing)
            raise bad("a number > 0")
    elif isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        if default and not value:  # blocks=[]: a network with no stages (fuzzing)
            raise bad("a non-empty list")
        if all(isinstance(d, int) and d >= 1 for d in default) and not all(
            is_whole(v, floats=False) and v >= 1 for v in value
        ):
            raise bad("a list of integers >= 1")


def resolve_config(
    name: str, *, batch: int | None = None, seq: int | None = None, **config: Any
) -> dict[str, Any]:
    """The full config of ``name`` with overrides applied; unknown keys raise ``ValueError``."""
    spec = _spec(name)
    valid = set(inspect.signature(spec.cls).parameters)
    bad = sorted(set(config) - valid)
    if bad:
        raise ValueError(
            f"graphs.zoo: {name!r} has no config key(s) {bad}; valid keys: {sorted(valid)}"
            + (", plus batch and seq" if spec.seq is not None else ", plus batch")
        )
    if seq is not None and spec.seq is None:
        raise ValueError(f"graphs.zoo: {name!r} takes images, not sequences; use image_size=")
    params = inspect.signature(spec.cls).parameters
    config = dict(config)
    for k, v in config.items():  # an override must have the type of the key's default
        if v is None and params[k].default is None:
            continue  # the model's own "unset" (e.g. n_kv_head=None: as many as n_head)
        default = spec.config.get(k, params[k].default)
        _check_config_value(name, k, v, default)
        if isinstance(default, int) and not isinstance(default, bool):
            config[k] = int(v)  # 2.0 -> 2 (the models index with it)
    for k, v in (("batch", batch), ("seq", seq)):
        if v is not None:
            _check_config_value(name, k, v, 1)
    cfg = dict(spec.config, **config)
    if "top_k" in cfg and "n_expert" in cfg and cfg["top_k"] > cfg["n_expert"]:
        raise ValueError(  # torch's "k not in range for dimension" from inside the trace
            f"graphs.zoo: {name!r} config top_k = {cfg['top_k']} is more than n_expert = "
            f"{cfg['n_expert']}: each token picks top_k of the n_expert experts"
        )
    if isinstance(cfg.get("blocks"), list):
        cfg["blocks"] = tuple(cfg["blocks"])
    cfg["batch"] = int(batch if batch is not None else spec.batch)
    if spec.seq is not None:
        cfg["seq"] = int(seq if seq is not None else spec.seq)
        if "n_ctx" in cfg and cfg["seq"] > cfg["n_ctx"]:
            if "n_ctx" in config:  # the user's own context length: refused, not raised
                raise ValueError(
                    f"graphs.zoo: {name!r} config n_ctx = {config['n_ctx']} is shorter than "
                    f"seq = {cfg['seq']}: the model has n_ctx positions; raise n_ctx or "
                    "leave it out (it then follows seq)"
                )
            cfg["n_ctx"] = cfg["seq"]  # the zoo's default context follows a longer seq
    if cfg["batch"] < 1 or cfg.get("seq", 1) < 1:
        raise ValueError(
            f"graphs.zoo: batch and seq must be >= 1, got {cfg['batch']}, {cfg.get('seq')}"
        )
    return cfg


def _inputs(
    spec: ModelSpec, cfg: dict[str, Any], device: torch.device | str, gen: torch.Generator | None
) -> tuple[torch.Tensor, ...]:
    b = cfg["batch"]
    meta = torch.device(device).type == "meta"

    def ints(high: int, *shape: int) -> torch.Tensor:
        if meta:
            return torch.empty(*shape, dtype=torch.long, device=device)
        return torch.randint(0, high, shape, generator=gen).to(device)

    if spec.inputs in ("tokens", "mlm"):
        return (ints(cfg["vocab"], b, cfg["seq"]),)
    if spec.inputs == "seq2seq":
        return ints(cfg["vocab"], b, cfg["seq"]), ints(cfg["vocab"], b, cfg["seq"] + 1)
    s = cfg["image_size"]
    img = (
        torch.empty(b, 3, s, s, device=device)
        if meta
        else torch.randn(b, 3, s, s, generator=gen).to(device)
    )
    return img, ints(cfg["num_classes"], b)


def _loss(spec: ModelSpec) -> Callable[..., torch.Tensor]:
    from graphs.zoo.rnn import nmt_loss

    return {"tokens": lm_loss, "mlm": mlm_loss, "seq2seq": nmt_loss, "image": cls_loss}[spec.inputs]


def build_module(
    name: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    **config: Any,
) -> ZooModel:
    """Model ``name`` (with config overrides) on ``device``, example inputs and loss function.

    ``device="meta"`` allocates no weights (this is what :func:`build` uses).
    Weights and inputs are seeded by ``seed``. Unknown names or config keys
    raise ``ValueError`` listing the valid ones.
    """
    spec = _spec(name)
    cfg = resolve_config(name, batch=batch, seq=seq, **config)
    kwargs = {k: v for k, v in cfg.items() if k not in ("batch", "seq")}
    gen = None
    if torch.device(device).type != "meta":
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
    with torch.device(device):
        module = spec.cls(**kwargs)
    module.train()
    return ZooModel(module, _inputs(spec, cfg, device, gen), _loss(spec), dict(cfg, name=name))


def build(
    name: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    max_groups: int | None = None,
    cache: bool = True,
    precision: str = "mixed",
    optimizer: str = "adam",
    **config: Any,
) -> CompGraph:
    """Training graph of zoo model ``name``, extracted on meta tensors (no weights allocated).

    ``build("gpt", hidden=, layers=, heads=, vocab=, seq=)`` and ``build("llama", hidden=,
    layers=, heads=, vocab=, seq=, ffn=, kv_heads=, tied=False)`` instead build a layered
    graph of any size from the dimensions with analytic costs
    (:mod:`graphs.zoo.parametric`); ``"llama"`` without dimension keywords is the
    extracted LLaMA-7B-shaped model as before.

    ``batch`` / ``seq`` default per model (``gpt2-xl``: 8 x 1024); other
    keywords override the model config (``n_layer=2, d_model=64, ...``).
    ``max_groups`` coarsens the graph with :func:`graphs.coarsening.coarsen`.
    Results are cached on disk (see :mod:`graphs.zoo.cache`) keyed by name,
    config, precision, optimizer, ``max_groups``, :data:`VERSION` and a digest of the
    extraction / model source (:data:`SOURCE_DIGEST`);
    ``cache=False`` neither reads nor writes the cache.
    """
    from graphs.zoo.parametric import build_named, is_parametric

    if is_parametric(name, config):
        if max_groups is not None:
            raise ValueError(f"graphs.zoo.build: parametric {name!r} takes no max_groups")
        if (precision, optimizer) != ("mixed", "adam"):
            raise ValueError(
                f"graphs.zoo.build: parametric {name!r} models mixed-precision Adam only"
            )
        extra = {"batch": batch} if batch is not None else {}
        if seq is not None:
            extra["seq"] = seq
        return build_named(name, **extra, **config)
    cfg = resolve_config(name, batch=batch, seq=seq, **config)
    if max_groups is not None and not (is_whole(max_groups, floats=False) and max_groups >= 1):
        raise ValueError(  # max_groups=True was taken as 1 group (found by fuzzing)
            f"graphs.zoo.build: max_groups must be an integer >= 1 or None, got {max_groups!r}"
        )
    key = cache_key(
        name=name, config=cfg, precision=precision, optimizer=optimizer,
        max_groups=max_groups, version=VERSION, source=SOURCE_DIGEST,
    )  # fmt: skip
    path = cache_dir() / f"{name}-{key}.npz"
    if cache and path.exists():
        try:
            return load_npz(path)
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # unreadable cache entry: rebuild it
    if max_groups is not None:
        from graphs.coarsening import coarsen

        graph = coarsen(
            build(name, cache=cache, precision=precision, optimizer=optimizer, **_plain(cfg)),
            max_groups,
        )
    else:
        from graphs.extraction import extract

        try:
            with _quiet_fake_tensor_log():
                zm = build_module(name, device="meta", **_plain(cfg))
                graph = extract(
                    zm.module, zm.example_inputs, name=name, loss_fn=zm.loss_fn,
                    precision=precision, optimizer=optimizer, batch=cfg["batch"],
                )  # fmt: skip
        except (RuntimeError, ValueError) as exc:  # a config the model cannot run
            # (image_size=16 for inception-v3: a kernel larger than its input; 75: torch's
            # batch norm "Expected more than 1 value per channel", a ValueError): named
            if isinstance(exc, ValueError) and str(exc).startswith("graphs."):
                raise  # this package's own check, already named
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(
                f"graphs.zoo.build: {name!r} with {dict(config)} cannot run on its example input "
                f"(batch {cfg['batch']}{', seq ' + str(cfg['seq']) if 'seq' in cfg else ''}): "
                f"{first}"
            ) from exc
        meta = dict(graph.meta, config=_jsonable(cfg))
        graph = graph.replace(meta=meta)
    if cache:
        save_npz(graph, path)
    return graph


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Any:
    """torch.export logs a failing op's traceback at ERROR level before raising it; the
    raised error is reported (named) by :func:`build`, so the log is only noise."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k != "name"}


def _jsonable(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}


def analytic_flops(name: str, graph: CompGraph) -> float:
    """``2 * params * tokens + attention`` forward FLOPs of a decoder LM (for validation).

    Attention: ``4 * batch * seq^2 * d_model * n_layer`` (scores and weighted
    sum, no causal saving). Only defined for the GPT-2 family and LLaMA.
    """
    cfg = graph.meta.get("config") or {}
    if not name.startswith(("gpt2", "llama")) or not cfg:
        raise ValueError(f"analytic_flops: defined for gpt2* and llama graphs, not {name!r}")
    b, s = cfg["batch"], cfg["seq"]
    return 2.0 * graph.num_params * b * s + 4.0 * b * s**2 * cfg["d_model"] * cfg["n_layer"]


__all__ = ["VERSION", "ZooModel", "analytic_flops", "build", "build_module", "names"]
