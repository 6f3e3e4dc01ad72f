"""Placeto network: directed GraphSAGE node embeddings with device-pair scores."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from agents.policies.base import PlacementNet
from agents.policies.dense import DenseGraph, to_pyg
from agents.policies.sage import GraphEncoder


class PlacetoNet(PlacementNet):
    r"""Placeto (Addanki et al., "Placeto: Learning Generalizable Device Placement
    Algorithms for Distributed Machine Learning", NeurIPS 2019).

    Node features include the current placement (through the embedding of each
    node's device, see :class:`~agents.policies.base.PlacementNet`) and a flag on
    the node being decided; a :class:`~agents.policies.sage.GraphEncoder`
    aggregates parents and children separately:

    .. math::
        \mathbf{h}_i = \operatorname{GraphEncoder}\left(
            [\mathbf{x}_i \,\|\, c_i \,\|\, \textstyle\sum_d a_{id}\mathbf{P}\mathbf{e}_d]
        \right), \qquad s_{id} = \operatorname{PairScorer}(\mathbf{h}_i, \mathbf{e}_d)

    The Sweep environment reads the row of the current node; Reassign and
    OneShot read every row.

    Args:
        node_dim, edge_dim, dev_dim, link_dim: input feature sizes.
        hidden: embedding size. (default: ``64``)
        num_layers: message-passing rounds over the graph. (default: ``3``)
        aggr: neighbourhood aggregation. (default: ``"mean"``)
        **kwargs: ``dev_layers``, ``place_dim``, ``score_dim`` of
            :class:`~agents.policies.base.PlacementNet`.

    Shapes:
        - **input:** :class:`~agents.policies.dense.DenseGraph` (``B`` samples,
          ``N`` nodes, ``D`` devices)
        - **output:** scores :math:`(B, N, D)`, value :math:`(B, 1)`
    """

    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        dev_dim: int,
        link_dim: int,
        hidden: int = 64,
        num_layers: int = 3,
        aggr: str = "mean",
        **kwargs: Any,
    ) -> None:
        super().__init__(node_dim, edge_dim, dev_dim, link_dim, hidden, **kwargs)
        self.num_layers = num_layers
        self.aggr = aggr
        self.encoder = GraphEncoder(
            self.node_in_dim, hidden, num_layers, edge_dim=edge_dim or None, aggr=aggr
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.encoder.reset_parameters()

    def config(self) -> dict[str, Any]:
        return {**super().config(), "num_layers": self.num_layers, "aggr": self.aggr}

    def embed_nodes(self, x: Tensor, g: DenseGraph) -> Tensor:
        B, N, _ = x.shape
        flat, edge_index, edge_attr, _ = to_pyg(
            DenseGraph(**{**g.__dict__, "x": x})  # same batch, augmented node inputs
        )
        h = self.encoder(flat, edge_index, edge_attr if self.edge_dim else None)
        return h.view(B, N, -1)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(node_dim={self.node_dim}, edge_dim={self.edge_dim}, "
            f"hidden={self.hidden}, num_layers={self.num_layers}, aggr={self.aggr})"
        )
