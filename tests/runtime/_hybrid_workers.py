"""Worker functions for the hybrid runtime tests (importable by spawned processes)."""

from __future__ import annotations

from collections import Counter

from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from runtime.dist import init_distributed, seed_everything, teardown


class Observe(TorchDispatchMode):
    """Sees the ops the program calls on DTensors: counts the explicit redistributions'
    functional collectives by name, and records the placements of every layer norm's input."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.layer_norm_inputs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.__name__.split(".")[0]
        if func.namespace == "_c10d_functional" and name != "wait_tensor":
            self.counts[name] += 1
        if name in ("layer_norm", "native_layer_norm") and isinstance(args[0], DTensor):
            self.layer_norm_inputs.append(str(args[0].placements))
        return func(*args, **(kwargs or {}))


def observe_steps(cases: list[tuple[dict, dict]]) -> list[dict]:
    """Per ``(layout, model)`` case, one ``HybridRunner`` step observed by :class:`Observe`:
    collective counts, layer-norm input placements, the loss and the full gradients."""
    from runtime.hybrid import HybridSpec, make_runner
    from runtime.model import load_model

    info = init_distributed(timeout_s=120)
    out = []
    try:
        for lay, model in cases:
            seed_everything(0)
            zm = load_model(model)
            runner = make_runner(
                zm.module, zm.loss_fn, zm.example_inputs, HybridSpec.from_layout(lay),
                rank=info.rank, world_size=info.world_size,
            )  # fmt: skip
            seen = Observe()
            with seen:
                loss = runner.forward_backward(zm.example_inputs)
            grads = {k: v.tolist() for k, v in runner.full_grads().items()}
            out.append(
                {
                    "loss": loss,
                    "comms": dict(seen.counts),
                    "layer_norm_inputs": seen.layer_norm_inputs,
                    "grads": grads,
                }
            )
        return out
    finally:
        teardown()
