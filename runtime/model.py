"""Build the real model a plan names: a zoo model or an importable factory, identically on every rank."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class RuntimeModel:
    """What the runtime needs of a model (the shape of ``graphs.zoo.ZooModel``).

    Attributes:
        module: the ``nn.Module``.
        example_inputs: the global batch, a tuple of tensors (batch on dim 0).
        loss_fn: ``loss_fn(output, *inputs) -> scalar tensor`` (a mean over the batch).
        config: the configuration it was built from.
    """

    module: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    loss_fn: Callable[..., torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)


def load_model(
    spec: Mapping[str, Any], *, device: str | torch.device | None = None
) -> RuntimeModel:
    """Build the model described by ``spec``.

    ``spec`` is ``{"name": zoo_name, "config": {...}}`` (``graphs.zoo.build_module``)
    or ``{"factory": "package.module:function", "config": {...}}`` where the
    function takes the config as keyword arguments and returns an object with
    ``module``, ``example_inputs`` and ``loss_fn`` (a ``RuntimeModel`` or
    ``ZooModel``). Call after seeding: every rank must build identical weights.
    ``device="meta"`` builds shapes only (for checks before launch): zoo models get it
    as their ``device``, factories run under ``torch.device(device)``.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"model spec must be a mapping, got {type(spec).__name__}")
    config = dict(spec.get("config") or {})
    if "factory" in spec:
        target = str(spec["factory"])
        mod_name, sep, fn_name = target.partition(":")
        if not sep or not mod_name or not fn_name:
            raise ValueError(
                f"model spec 'factory'={target!r} must look like 'package.module:function'"
            )
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model spec 'factory'={target!r} cannot be imported: {exc}") from None
        if device is None:
            built = fn(**config)
        else:
            with torch.device(device):
                built = fn(**config)
    elif "name" in spec:
        from graphs import zoo
        from graphs.zoo.parametric import is_parametric, module_spec

        if is_parametric(str(spec["name"]), config):  # gpt / llama by dimension
            mapped = module_spec(str(spec["name"]), config)
            spec, config = mapped, dict(mapped["config"])
        extra = {} if device is None else {"device": device}
        built = zoo.build_module(str(spec["name"]), **extra, **config)
    else:
        raise ValueError(
            f"model spec needs 'name' (a graphs.zoo model) or 'factory'; got keys {sorted(spec)}"
        )
    for attr in ("module", "example_inputs", "loss_fn"):
        if not hasattr(built, attr):
            raise ValueError(f"model built from {dict(spec)!r} has no attribute {attr!r}")
    inputs = built.example_inputs
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return RuntimeModel(built.module, inputs, built.loss_fn, dict(getattr(built, "config", config)))


def graph_for_model(spec: Mapping[str, Any]) -> Any:
    """The training ``CompGraph`` whose forward node names match :func:`load_model` of ``spec``.

    Zoo models use ``graphs.zoo.build(name, max_groups=spec.get("max_groups"), **config)``;
    factory models are extracted from the real module with ``graphs.extraction``.
    """
    config = dict(spec.get("config") or {})
    if "name" in spec:
        from graphs import zoo

        return zoo.build(str(spec["name"]), max_groups=spec.get("max_groups"), **config)
    from graphs.extraction import extract

    zm = load_model(spec)
    graph = extract(zm.module, zm.example_inputs, loss_fn=zm.loss_fn, name=str(spec.get("factory")))
    if spec.get("max_groups"):
        from graphs.coarsening import coarsen

        graph = coarsen(graph, int(spec["max_groups"]))
    return graph
