"""GDPEnsemble: several GDP networks read as one product of experts over each node's devices."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from agents.policies.dense import DenseGraph
from agents.policies.device_head import MASK_LOGIT
from agents.policies.gdp import GDPNet


class GDPEnsemble(GDPNet):
    r"""``members`` :class:`~agents.policies.gdp.GDPNet` networks of one configuration,
    trained apart (e.g. behaviour cloning with different seeds), combined as a product of
    experts over each node's devices:

    .. math::
        s_{id} = \frac{1}{M} \sum_{m=1}^{M} \log \operatorname{softmax}_{d}\, s^{(m)}_{id},
        \qquad v = \frac{1}{M} \sum_m v^{(m)}

    so :math:`\operatorname{softmax}_d s_{id} \propto \prod_m p_m(d \mid i)^{1/M}`. Each row
    of the result is a normalised log-probability up to a constant, so readers that normalise
    per node (``per_node`` policies, chain decoding) see the geometric mean of the members'
    distributions; padded pairs stay at :data:`MASK_LOGIT`. The members are independent
    sub-modules (``members.0.*``, ``members.1.*``, ...), so the ensemble is saved, loaded and
    fine-tuned like any network; fine-tuning trains the members jointly through the mean.

    Args:
        node_dim, edge_dim, dev_dim, link_dim: input feature sizes.
        members: how many networks. (default: ``3``)
        **kwargs: the :class:`~agents.policies.gdp.GDPNet` options of every member.

    Shapes:
        - **input:** :class:`~agents.policies.dense.DenseGraph` (``B`` samples, ``N`` nodes,
          ``D`` devices)
        - **output:** scores :math:`(B, N, D)`, value :math:`(B, 1)`
    """

    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        dev_dim: int,
        link_dim: int,
        members: int = 3,
        **kwargs: Any,
    ) -> None:
        if not isinstance(members, int) or members < 1:
            raise ValueError(f"GDPEnsemble: members={members!r} must be an integer >= 1")
        nn.Module.__init__(self)  # the members hold every weight; no shared layers
        self.members = nn.ModuleList(
            GDPNet(node_dim, edge_dim, dev_dim, link_dim, **kwargs) for _ in range(members)
        )

    @classmethod
    def of(cls, nets: list[GDPNet]) -> GDPEnsemble:
        """The ensemble of trained ``nets`` (same configuration; their weights are copied)."""
        if not nets:
            raise ValueError("GDPEnsemble.of: no networks given")
        cfg = nets[0].config()
        for k, n in enumerate(nets):
            if type(n) is not GDPNet or n.config() != cfg:
                raise ValueError(
                    f"GDPEnsemble.of: network {k} is a {type(n).__name__} with config "
                    f"{n.config() if isinstance(n, GDPNet) else None}; expected GDPNet {cfg}"
                )
        ens = cls(**cfg, members=len(nets))
        for m, n in zip(ens.members, nets):
            m.load_state_dict(n.state_dict())
        return ens

    def reset_parameters(self) -> None:
        for m in self.members:
            m.reset_parameters()

    def config(self) -> dict[str, Any]:
        return {**self.members[0].config(), "members": len(self.members)}

    def forward(self, g: DenseGraph) -> tuple[Tensor, Tensor]:
        logp, values = [], []
        pad = None
        for m in self.members:
            s, v = m(g)
            if pad is None:
                pad = s <= MASK_LOGIT  # padded (node, device) pairs
            logp.append(torch.log_softmax(s, dim=-1))
            values.append(v)
        scores = torch.stack(logp).mean(0).masked_fill(pad, MASK_LOGIT)
        return scores, torch.stack(values).mean(0)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({len(self.members)} x {self.members[0]!r})"
