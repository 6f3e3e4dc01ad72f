"""Padded dense graph batches (SB3 observations) and their vectorised conversion to PyG form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DenseGraph:
    """A batch of ``B`` padded placement problems, as the policies consume it.

    Node rows are colocation units; padding rows/columns are masked out.
    """

    x: Tensor  # (B, N, F) float node features (current placement excluded)
    node_mask: Tensor  # (B, N) bool, True for real nodes
    edge_index: Tensor  # (B, 2, E) long, local node indices (row 0 = source)
    edge_attr: Tensor  # (B, E, Fe) float edge features
    edge_mask: Tensor  # (B, E) bool, True for real edges
    dev_x: Tensor  # (B, D, Fd) float device features
    dev_mask: Tensor  # (B, D) bool, True for real devices
    dev_link: Tensor  # (B, D, D, Fl) float device-pair link features
    assign: Tensor  # (B, N, D) float, one-hot current device of each node (zeros: unplaced)
    current: Tensor  # (B, N) float, 1 on the unit being decided (Sweep), else zeros

    @property
    def batch_size(self) -> int:
        return int(self.x.shape[0])

    @property
    def max_nodes(self) -> int:
        return int(self.x.shape[1])

    @property
    def max_devices(self) -> int:
        return int(self.dev_x.shape[1])


def to_pyg(g: DenseGraph) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flatten a padded batch into one disjoint PyG graph, without a Python loop.

    Every padded slot keeps its row (node ``i`` of sample ``b`` becomes node
    ``b * N + i``), so results reshape back to ``(B, N, H)``; padded nodes have
    no edges and padded edges are dropped.

    Returns:
        ``(x, edge_index, edge_attr, batch)`` with shapes ``(B*N, F)``,
        ``(2, E')``, ``(E', Fe)`` and ``(B*N,)``.
    """
    B, N, F = g.x.shape
    E = g.edge_index.shape[-1]
    offsets = (torch.arange(B, device=g.x.device) * N).view(B, 1, 1)
    ei = (g.edge_index.long() + offsets).permute(1, 0, 2).reshape(2, B * E)
    keep = g.edge_mask.reshape(-1).bool()
    edge_index = ei[:, keep]
    edge_attr = g.edge_attr.reshape(B * E, -1)[keep]
    batch = torch.arange(B, device=g.x.device).repeat_interleave(N)
    return g.x.reshape(B * N, F), edge_index, edge_attr, batch


def masked_mean(x: Tensor, mask: Tensor, dim: int = 1) -> Tensor:
    """Mean of ``x`` over ``dim`` counting only entries where ``mask`` is true (0 if none)."""
    m = mask.to(x.dtype).unsqueeze(-1)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def masked_max(x: Tensor, mask: Tensor, dim: int = 1) -> Tensor:
    """Max of ``x`` over ``dim`` among entries where ``mask`` is true (0 if none)."""
    m = mask.bool().unsqueeze(-1)
    out = x.masked_fill(~m, float("-inf")).amax(dim)
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))


#: Observation keys the policies read (the ``spaces.Dict`` of ``placement_env.encoding``).
OBS_KEYS: tuple[str, ...] = (
    "node_feat",
    "edge_index",
    "edge_feat",
    "device_feat",
    "link_feat",
    "global_feat",
    "placement",
    "current",
    "node_mask",
    "edge_mask",
    "device_mask",
)


def obs_dims(sizes: Mapping[str, int]) -> dict[str, int]:
    """Feature sizes and padding bounds from the flat length of each observation key.

    ``sizes`` maps every key of :data:`OBS_KEYS` to its flat length (the ``Box``
    shape of the env's observation space). Returns ``max_nodes``, ``max_edges``,
    ``max_devices`` and the network input sizes ``node_dim`` (node plus global
    features), ``edge_dim``, ``dev_dim`` and ``link_dim``.
    """
    missing = [k for k in OBS_KEYS if k not in sizes]
    if missing:
        raise ValueError(
            f"observation lacks keys {missing}; the graph policies need {list(OBS_KEYS)}"
        )
    n, e, d = sizes["node_mask"], sizes["edge_mask"], sizes["device_mask"]
    for key, total, rows in (
        ("node_feat", sizes["node_feat"], n),
        ("edge_feat", sizes["edge_feat"], e),
        ("device_feat", sizes["device_feat"], d),
        ("link_feat", sizes["link_feat"], d * d),
    ):
        if rows <= 0 or total % rows:
            raise ValueError(
                f"observation key {key!r} has {total} entries, not a multiple of {rows}"
            )
    if sizes["edge_index"] != 2 * e:
        raise ValueError(
            f"observation key 'edge_index' has {sizes['edge_index']} entries, expected {2 * e}"
        )
    return {
        "max_nodes": n,
        "max_edges": e,
        "max_devices": d,
        "node_dim": sizes["node_feat"] // n + sizes["global_feat"],
        "edge_dim": sizes["edge_feat"] // e,
        "dev_dim": sizes["device_feat"] // d,
        "link_dim": sizes["link_feat"] // (d * d),
    }


def dense_from_obs(obs: Mapping[str, Tensor]) -> DenseGraph:
    """A :class:`DenseGraph` from a batch of flat observations (``(B, size)`` tensors).

    Sizes come from the masks, so one network reads observations of any padding;
    global features are appended to every node's features; ``placement`` becomes
    a one-hot ``assign`` and ``current`` a one-hot flag (both zero where ``-1``).
    """
    if obs["node_mask"].dim() == 1:  # unbatched
        obs = {k: v.unsqueeze(0) for k, v in obs.items()}
    dims = obs_dims({k: int(obs[k].shape[-1]) for k in OBS_KEYS})
    B = int(obs["node_mask"].shape[0])
    N, E, D = dims["max_nodes"], dims["max_edges"], dims["max_devices"]
    node = obs["node_feat"].float().view(B, N, -1)
    glob = obs["global_feat"].float().view(B, 1, -1).expand(B, N, -1)
    placement = obs["placement"].round().long().view(B, N)
    assign = torch.zeros(B, N, D + 1, device=node.device)
    assign.scatter_(2, torch.where(placement >= 0, placement, D).clamp(0, D).unsqueeze(-1), 1.0)
    cur = obs["current"].round().long().view(B, 1)
    current = torch.zeros(B, N + 1, device=node.device)
    current.scatter_(1, torch.where(cur >= 0, cur, N).clamp(0, N), 1.0)
    return DenseGraph(
        x=torch.cat([node, glob], dim=-1),
        node_mask=obs["node_mask"].view(B, N) > 0.5,
        edge_index=obs["edge_index"].round().long().view(B, 2, E).clamp(0, N - 1),
        edge_attr=obs["edge_feat"].float().view(B, E, -1),
        edge_mask=obs["edge_mask"].view(B, E) > 0.5,
        dev_x=obs["device_feat"].float().view(B, D, -1),
        dev_mask=obs["device_mask"].view(B, D) > 0.5,
        dev_link=obs["link_feat"].float().view(B, D, D, -1),
        assign=assign[:, :, :D],
        current=current[:, :N],
    )
