"""Directed GraphSAGE layers: forward (parents) and backward (children) aggregation."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing


class BiSAGEConv(MessagePassing):
    r"""GraphSAGE convolution over a DAG that aggregates parents and children separately.

    From Placeto (Addanki et al., "Placeto: Learning Generalizable Device
    Placement Algorithms for Distributed Machine Learning", NeurIPS 2019), whose
    node embedding runs message passing both along and against the edges of the
    computation graph, on top of GraphSAGE (Hamilton et al., NeurIPS 2017):

    .. math::
        \mathbf{x}'_i = \mathbf{W}_{r}\mathbf{x}_i
            + \mathbf{W}_{f} \operatorname{mean}_{j \to i}
              \left(\mathbf{x}_j + \mathbf{W}_{e}\mathbf{e}_{ji}\right)
            + \mathbf{W}_{b} \operatorname{mean}_{i \to k}
              \left(\mathbf{x}_k + \mathbf{W}_{e'}\mathbf{e}_{ik}\right)

    A node without parents (children) receives a zero forward (backward) term.

    Args:
        in_channels: size of each input node embedding.
        out_channels: size of each output node embedding.
        edge_dim: size of the edge features, or ``None`` to ignore them. (default: ``None``)
        aggr: neighbourhood aggregation, ``"mean"``, ``"sum"`` or ``"max"``. (default: ``"mean"``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)` (row 0 = source), optional edge features
          :math:`(|\mathcal{E}|, D)`
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})`
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        edge_dim: int | None = None,
        aggr: str = "mean",
    ) -> None:
        super().__init__(aggr=aggr)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.edge_dim = edge_dim
        self.lin_root = nn.Linear(in_channels, out_channels)
        self.lin_fwd = nn.Linear(in_channels, out_channels, bias=False)
        self.lin_bwd = nn.Linear(in_channels, out_channels, bias=False)
        if edge_dim is not None:
            self.lin_edge_fwd: nn.Linear | None = nn.Linear(edge_dim, in_channels, bias=False)
            self.lin_edge_bwd: nn.Linear | None = nn.Linear(edge_dim, in_channels, bias=False)
        else:
            self.lin_edge_fwd = self.lin_edge_bwd = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for lin in (
            self.lin_root,
            self.lin_fwd,
            self.lin_bwd,
            self.lin_edge_fwd,
            self.lin_edge_bwd,
        ):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        e_fwd = e_bwd = None
        if self.lin_edge_fwd is not None and self.lin_edge_bwd is not None:
            if edge_attr is None:
                raise ValueError(
                    f"{self!r} was built with edge_dim={self.edge_dim} but got no edge_attr"
                )
            e_fwd, e_bwd = self.lin_edge_fwd(edge_attr), self.lin_edge_bwd(edge_attr)
        fwd = self.propagate(edge_index, x=x, e=e_fwd)
        bwd = self.propagate(edge_index.flip(0), x=x, e=e_bwd)
        return self.lin_root(x) + self.lin_fwd(fwd) + self.lin_bwd(bwd)

    def propagate(
        self, edge_index: Tensor, size: tuple[int, int] | None = None, **kwargs
    ) -> Tensor:
        """:class:`MessagePassing`'s own ``propagate``. Defined here so that PyG keeps it
        rather than rendering its TorchScript template for this class, which wrote a module
        ``agents.policies.sage_BiSAGEConv_propagate_*.py`` into the temporary folder in
        every process and never removed it (70 files in ``/tmp`` after a day's tests, 2 Dec
        2026). The same computation (tested); this layer is not TorchScripted."""
        return super().propagate(edge_index, size=size, **kwargs)

    def message(self, x_j: Tensor, e: Tensor | None) -> Tensor:
        return x_j if e is None else x_j + e

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"edge_dim={self.edge_dim}, aggr={self.aggr})"
        )


class GraphEncoder(nn.Module):
    r"""Stack of :class:`BiSAGEConv` layers with residual connections and layer norm.

    Placeto's graph embedding (Addanki et al., NeurIPS 2019): an input
    projection, then ``num_layers`` rounds of forward and backward message
    passing, so each node sees its ancestors and descendants up to
    ``num_layers`` hops away:

    .. math::
        \mathbf{h}^{0}_i = \mathbf{W}_{in}\mathbf{x}_i, \qquad
        \mathbf{h}^{l+1}_i = \operatorname{LN}\left(\mathbf{h}^{l}_i
            + \operatorname{ReLU}(\operatorname{BiSAGE}(\mathbf{h}^{l})_i)\right)

    Args:
        in_channels: node feature size.
        hidden: embedding size. (default: ``64``)
        num_layers: message-passing rounds. (default: ``3``)
        edge_dim: edge feature size, or ``None``. (default: ``None``)
        aggr: aggregation of :class:`BiSAGEConv`. (default: ``"mean"``)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)`, optional edge features :math:`(|\mathcal{E}|, D)`
        - **output:** node embeddings :math:`(|\mathcal{V}|, H)`
    """

    def __init__(
        self,
        in_channels: int,
        hidden: int = 64,
        num_layers: int = 3,
        edge_dim: int | None = None,
        aggr: str = "mean",
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.hidden = hidden
        self.num_layers = num_layers
        self.edge_dim = edge_dim
        self.aggr = aggr
        self.lin_in = nn.Linear(in_channels, hidden)
        self.convs = nn.ModuleList(
            BiSAGEConv(hidden, hidden, edge_dim=edge_dim, aggr=aggr) for _ in range(num_layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        for conv, norm in zip(self.convs, self.norms):
            conv.reset_parameters()
            norm.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        h = self.lin_in(x)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, edge_index, edge_attr)))
        return h

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.hidden}, "
            f"num_layers={self.num_layers}, edge_dim={self.edge_dim}, aggr={self.aggr})"
        )
