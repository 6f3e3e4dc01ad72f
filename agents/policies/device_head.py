"""Device embeddings and (node, device) pair scoring, independent of the number of devices."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.policies.dense import masked_mean

#: Logit of padded (unit, device) pairs: probability 0 in float32, but above the -1e8 that
#: sb3-contrib gives masked actions, so an action the env's mask allows always beats one it forbids.
MASK_LOGIT = -1e4


class DeviceEncoder(nn.Module):
    r"""Embeds each device from its own features and the links to the other devices.

    A device's input is its features (speed, memory, free memory, ...), the
    mean of its link features and its position :math:`p_d = d / (D - 1)` in the
    cluster's device order (which breaks the symmetry of identical devices, so
    a policy can lay contiguous pipeline stages along the device chain); then ``num_layers`` rounds of message passing over
    the device graph, weighted by a learned positive function of each link:

    .. math::
        \mathbf{e}^{0}_d = \operatorname{MLP}\left([\mathbf{z}_d \,\|\,
            \operatorname{mean}_{d'} \mathbf{l}_{dd'} \,\|\, p_d]\right), \quad
        w_{dd'} = \operatorname{softplus}(\mathbf{a}^\top \mathbf{l}_{dd'}), \quad
        \mathbf{e}^{k+1}_d = \operatorname{LN}\left(\mathbf{e}^{k}_d + \operatorname{ReLU}
            \left(\mathbf{W}_s \mathbf{e}^{k}_d + \mathbf{W}_n
            \frac{\sum_{d' \ne d} w_{dd'} \mathbf{e}^{k}_{d'}}{\sum_{d' \ne d} w_{dd'}}\right)\right)

    Nothing depends on the number of devices ``D``, so one set of weights embeds
    clusters of 2, 4, 8 or 16 devices, homogeneous or not.

    Args:
        dev_dim: device feature size.
        link_dim: link feature size per device pair.
        hidden: embedding size. (default: ``64``)
        num_layers: message-passing rounds over the device graph. (default: ``2``)

    Shapes:
        - **input:** device features :math:`(B, D, F_d)`, device mask :math:`(B, D)`,
          link features :math:`(B, D, D, F_l)`
        - **output:** device embeddings :math:`(B, D, H)`
    """

    def __init__(self, dev_dim: int, link_dim: int, hidden: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        self.dev_dim = dev_dim
        self.link_dim = link_dim
        self.hidden = hidden
        self.num_layers = num_layers
        self.lin_in = nn.Linear(dev_dim + link_dim + 1, hidden)
        self.lin_in2 = nn.Linear(hidden, hidden)
        self.link_weight = nn.ModuleList(nn.Linear(link_dim, 1) for _ in range(num_layers))
        self.lin_self = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_layers))
        self.lin_nbr = nn.ModuleList(
            nn.Linear(hidden, hidden, bias=False) for _ in range(num_layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        self.lin_in2.reset_parameters()
        for mods in (self.link_weight, self.lin_self, self.lin_nbr, self.norms):
            for m in mods:
                m.reset_parameters()

    def forward(self, dev_x: Tensor, dev_mask: Tensor, dev_link: Tensor) -> Tensor:
        B, D, _ = dev_x.shape
        mask = dev_mask.bool()
        pair = mask.unsqueeze(2) & mask.unsqueeze(1)
        pair = pair & ~torch.eye(D, dtype=torch.bool, device=dev_x.device)
        link_mean = masked_mean(dev_link, pair, dim=2)  # (B, D, Fl)
        pos = device_position(mask).unsqueeze(-1).to(dev_x.dtype)  # (B, D, 1)
        e = self.lin_in2(F.relu(self.lin_in(torch.cat([dev_x, link_mean, pos], dim=-1))))
        for lw, ls, ln_, norm in zip(self.link_weight, self.lin_self, self.lin_nbr, self.norms):
            w = F.softplus(lw(dev_link).squeeze(-1)) * pair.to(e.dtype)  # (B, D, D)
            w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
            e = norm(e + F.relu(ls(e) + torch.bmm(w, ln_(e))))
        return e * mask.unsqueeze(-1).to(e.dtype)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.dev_dim}, {self.link_dim}, {self.hidden}, "
            f"num_layers={self.num_layers})"
        )


def device_position(dev_mask: Tensor) -> Tensor:
    """``(B, D)`` position ``d / (D_real - 1)`` of each real device in [0, 1] (0 for padding)."""
    m = dev_mask.to(torch.float32)
    idx = torch.cumsum(m, dim=1) - 1.0
    return torch.where(m > 0, idx / (m.sum(1, keepdim=True) - 1.0).clamp_min(1.0), 0.0)


class PairScorer(nn.Module):
    r"""Scores every (node, device) pair with additive attention (a pointer-network head).

    .. math::
        s_{id} = \mathbf{v}^\top \tanh\left(\mathbf{W}_n \mathbf{h}_i
            + \mathbf{W}_d \mathbf{e}_d + a_{id}\,\mathbf{w}_a + \mathbf{b}\right)

    where :math:`a_{id} = 1` when node ``i`` currently sits on device ``d``.
    Pairs with a padded node or device get :data:`MASK_LOGIT`.

    With ``keep_prob`` set, a learnable *keep* logit :math:`k` is added, outside the
    attention, to the pair of each node's current device:

    .. math::
        s'_{id} = s_{id} + a_{id}\left(k + \log(D - 1)\right), \qquad
        k_0 = \log\frac{p_{keep}}{1 - p_{keep}}

    where :math:`D` is the number of real devices. When the attention scores of a
    row are equal (as they nearly are at initialisation), the softmax keeps the
    node's device with probability :math:`\sigma(k)`, whatever :math:`D`: the
    initial policy explores locally around the current placement (e.g. a warm-start
    plan) instead of resampling every node, and PPO then learns :math:`k` with the
    rest. Env action masks are applied after the scores, so they still hold.

    Args:
        node_dim: node embedding size.
        dev_dim: device embedding size.
        hidden: attention size. (default: ``32``)
        keep_prob: initial probability of keeping a node's current device, in (0, 1),
            or ``None`` for no keep logit. (default: ``None``)

    Shapes:
        - **input:** node embeddings :math:`(B, N, H_n)`, device embeddings
          :math:`(B, D, H_d)`, current assignment :math:`(B, N, D)`, node mask
          :math:`(B, N)`, device mask :math:`(B, D)`
        - **output:** scores :math:`(B, N, D)`
    """

    def __init__(
        self, node_dim: int, dev_dim: int, hidden: int = 32, keep_prob: float | None = None
    ) -> None:
        super().__init__()
        if keep_prob is not None and not 0.0 < float(keep_prob) < 1.0:
            raise ValueError(f"keep_prob must be in (0, 1) or None, got {keep_prob!r}")
        self.node_dim = node_dim
        self.dev_dim = dev_dim
        self.hidden = hidden
        self.keep_prob = None if keep_prob is None else float(keep_prob)
        self.lin_node = nn.Linear(node_dim, hidden)
        self.lin_dev = nn.Linear(dev_dim, hidden, bias=False)
        self.assign_vec = nn.Parameter(torch.empty(hidden))
        self.v = nn.Linear(hidden, 1, bias=False)
        self.keep_logit: nn.Parameter | None = (
            nn.Parameter(torch.empty(())) if self.keep_prob is not None else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_node.reset_parameters()
        self.lin_dev.reset_parameters()
        self.v.reset_parameters()
        nn.init.normal_(self.assign_vec, std=0.1)
        if self.keep_logit is not None and self.keep_prob is not None:
            with torch.no_grad():
                self.keep_logit.fill_(math.log(self.keep_prob / (1.0 - self.keep_prob)))

    def forward(
        self, h: Tensor, e: Tensor, assign: Tensor, node_mask: Tensor, dev_mask: Tensor
    ) -> Tensor:
        u = self.lin_node(h).unsqueeze(2) + self.lin_dev(e).unsqueeze(1)  # (B, N, D, A)
        u = u + assign.unsqueeze(-1) * self.assign_vec
        s = self.v(torch.tanh(u)).squeeze(-1)
        if self.keep_logit is not None:
            others = (dev_mask.to(s.dtype).sum(1, keepdim=True) - 1.0).clamp_min(1.0)  # (B, 1)
            keep = self.keep_logit + torch.log(others)  # (B, 1)
            s = s + assign.to(s.dtype) * keep.unsqueeze(-1)
        valid = node_mask.bool().unsqueeze(2) & dev_mask.bool().unsqueeze(1)
        return s.masked_fill(~valid, MASK_LOGIT)

    def __repr__(self) -> str:
        keep = "" if self.keep_prob is None else f", keep_prob={self.keep_prob}"
        return f"{self.__class__.__name__}({self.node_dim}, {self.dev_dim}, hidden={self.hidden}{keep})"
