"""PlacementNet: the shared skeleton of the learned placement networks (devices, scores, value)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from agents.policies.dense import DenseGraph, masked_max, masked_mean
from agents.policies.device_head import DeviceEncoder, PairScorer


class PlacementNet(nn.Module):
    r"""Scores each (node, device) pair and values the state of a placement problem.

    Subclasses define :meth:`embed_nodes`. The forward pass:

    1. devices are embedded by :class:`DeviceEncoder` (:math:`\mathbf{e}_d`);
    2. each node's input is its features, the current-unit flag and a projection
       of the embedding of the device it sits on,
       :math:`[\mathbf{x}_i \,\|\, c_i \,\|\, \sum_d a_{id} \mathbf{P}\mathbf{e}_d]`,
       so the placement enters without fixing the number of devices;
    3. :meth:`embed_nodes` gives :math:`\mathbf{h}_i`;
    4. :class:`PairScorer` gives the scores :math:`s_{id}`; the value is an MLP of
       the masked mean and max of :math:`\mathbf{h}` and the mean of :math:`\mathbf{e}`.

    Args:
        node_dim, edge_dim, dev_dim, link_dim: input feature sizes.
        hidden: node and device embedding size. (default: ``64``)
        dev_layers: message-passing rounds over devices. (default: ``2``)
        place_dim: size of the placement projection :math:`\mathbf{P}`. (default: ``16``)
        score_dim: attention size of the pair scorer. (default: ``32``)
        keep_prob: initial probability that the pair scorer keeps a node on its
            current device (a learnable keep logit, see :class:`PairScorer`), or
            ``None`` for none. (default: ``None``)

    Shapes:
        - **input:** a :class:`DenseGraph` with ``B`` samples, ``N`` node slots and
          ``D`` device slots
        - **output:** scores :math:`(B, N, D)` (padded pairs = ``MASK_LOGIT``) and
          value :math:`(B, 1)`
    """

    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        dev_dim: int,
        link_dim: int,
        hidden: int = 64,
        dev_layers: int = 2,
        place_dim: int = 16,
        score_dim: int = 32,
        keep_prob: float | None = None,
    ) -> None:
        super().__init__()
        self.node_dim = node_dim
        self.edge_dim = edge_dim
        self.dev_dim = dev_dim
        self.link_dim = link_dim
        self.hidden = hidden
        self.dev_layers = dev_layers
        self.place_dim = place_dim
        self.score_dim = score_dim
        self.keep_prob = None if keep_prob is None else float(keep_prob)
        self.devices = DeviceEncoder(dev_dim, link_dim, hidden, dev_layers)
        self.place_proj = nn.Linear(hidden, place_dim)
        self.scorer = PairScorer(hidden, hidden, score_dim, keep_prob=self.keep_prob)
        self.value_head = nn.Sequential(
            nn.Linear(3 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    @property
    def node_in_dim(self) -> int:
        """Input size of :meth:`embed_nodes`: features, current flag, placement projection."""
        return self.node_dim + 1 + self.place_dim

    def reset_parameters(self) -> None:
        self.devices.reset_parameters()
        self.place_proj.reset_parameters()
        self.scorer.reset_parameters()
        for m in self.value_head:
            if isinstance(m, nn.Linear):
                m.reset_parameters()

    def config(self) -> dict[str, Any]:
        """Constructor arguments as plain types (``type(self)(**net.config())`` rebuilds it)."""
        return {
            "node_dim": self.node_dim,
            "edge_dim": self.edge_dim,
            "dev_dim": self.dev_dim,
            "link_dim": self.link_dim,
            "hidden": self.hidden,
            "dev_layers": self.dev_layers,
            "place_dim": self.place_dim,
            "score_dim": self.score_dim,
            "keep_prob": self.keep_prob,
        }

    def embed_nodes(self, x: Tensor, g: DenseGraph) -> Tensor:
        """Node embeddings ``(B, N, hidden)`` from node inputs ``x`` ``(B, N, node_in_dim)``."""
        raise NotImplementedError

    def forward(self, g: DenseGraph) -> tuple[Tensor, Tensor]:
        e = self.devices(g.dev_x, g.dev_mask, g.dev_link)  # (B, D, H)
        placed = torch.bmm(g.assign.to(e.dtype), self.place_proj(e))  # (B, N, P)
        x = torch.cat([g.x, g.current.unsqueeze(-1).to(g.x.dtype), placed], dim=-1)
        h = self.embed_nodes(x, g)
        h = h * g.node_mask.unsqueeze(-1).to(h.dtype)
        scores = self.scorer(h, e, g.assign, g.node_mask, g.dev_mask)
        pooled = torch.cat(
            [
                masked_mean(h, g.node_mask),
                masked_max(h, g.node_mask),
                masked_mean(e, g.dev_mask),
            ],
            dim=-1,
        )
        return scores, self.value_head(pooled)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(node_dim={self.node_dim}, edge_dim={self.edge_dim}, "
            f"dev_dim={self.dev_dim}, link_dim={self.link_dim}, hidden={self.hidden})"
        )
