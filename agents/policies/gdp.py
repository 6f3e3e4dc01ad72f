"""GDP network: a graph encoder followed by a Transformer over all node embeddings."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from agents.policies.dense import DenseGraph
from agents.policies.placeto import PlacetoNet


class GDPNet(PlacetoNet):
    r"""GDP (Zhou et al., "GDP: Generalized Device Placement for Dataflow Graphs", 2019).

    The graph encoder of :class:`~agents.policies.placeto.PlacetoNet` gives local
    structure; a Transformer encoder then lets every node attend to every other
    node of its graph (padded nodes are excluded by a key-padding mask), and the
    pair scorer places all nodes at once:

    .. math::
        \mathbf{h} = \operatorname{Transformer}\left(\operatorname{GraphEncoder}(\mathbf{x})
            ;\ \text{key padding} = \neg\,\text{node\_mask}\right), \qquad
        s_{id} = \operatorname{PairScorer}(\mathbf{h}_i, \mathbf{e}_d)

    Args:
        node_dim, edge_dim, dev_dim, link_dim: input feature sizes.
        hidden: embedding size (the Transformer's ``d_model``). (default: ``64``)
        num_layers: graph message-passing rounds. (default: ``2``)
        attn_layers: Transformer encoder layers. (default: ``2``)
        heads: attention heads. (default: ``4``)
        dropout: Transformer dropout. (default: ``0.0``)
        **kwargs: ``aggr`` and the :class:`~agents.policies.base.PlacementNet` options.

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
        num_layers: int = 2,
        attn_layers: int = 2,
        heads: int = 4,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if hidden % heads:
            raise ValueError(f"GDPNet: hidden={hidden} must be divisible by heads={heads}")
        self.attn_layers = attn_layers
        self.heads = heads
        self.dropout = dropout
        super().__init__(node_dim, edge_dim, dev_dim, link_dim, hidden, num_layers, **kwargs)
        layer = nn.TransformerEncoderLayer(
            hidden, heads, dim_feedforward=2 * hidden, dropout=dropout, batch_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, attn_layers, enable_nested_tensor=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "transformer"):
            for layer in self.transformer.layers:
                for m in layer.modules():
                    if m is not layer and hasattr(m, "_reset_parameters"):
                        m._reset_parameters()
                    elif isinstance(m, (nn.Linear, nn.LayerNorm)):
                        m.reset_parameters()

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "attn_layers": self.attn_layers,
            "heads": self.heads,
            "dropout": self.dropout,
        }

    def embed_nodes(self, x: Tensor, g: DenseGraph) -> Tensor:
        h = super().embed_nodes(x, g)
        mask = g.node_mask.bool()
        # a sample without any node would make every key masked (NaN); keep slot 0 visible
        mask = mask.clone()
        mask[:, 0] |= ~mask.any(1)
        return self.transformer(h, src_key_padding_mask=~mask)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(node_dim={self.node_dim}, edge_dim={self.edge_dim}, "
            f"hidden={self.hidden}, num_layers={self.num_layers}, "
            f"attn_layers={self.attn_layers}, heads={self.heads})"
        )
