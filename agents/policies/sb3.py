"""SB3 actor-critic policies whose action distribution comes from (node, device) scores."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableDistribution
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import Tensor

from agents.policies.base import PlacementNet
from agents.policies.dense import DenseGraph, dense_from_obs, obs_dims

#: How the (B, N, D) score tensor becomes the logits of each action space.
ACTION_MODES: tuple[str, ...] = ("current_row", "flat", "per_node")


def action_mode(action_space: spaces.Space, max_nodes: int, max_devices: int) -> str:
    """Which reading of the scores matches ``action_space``.

    - ``Discrete(max_devices)``: the row of the current unit (Sweep);
    - ``Discrete(max_nodes * max_devices)``: all scores flattened, unit-major (Reassign);
    - ``MultiDiscrete([max_devices] * max_nodes)``: one categorical per unit (OneShot).
    """
    N, D = max_nodes, max_devices
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.n) == D:
            return "current_row"
        if int(action_space.n) == N * D:
            return "flat"
    elif isinstance(action_space, spaces.MultiDiscrete):
        nvec = np.asarray(action_space.nvec).reshape(-1)
        if len(nvec) == N and (nvec == D).all():
            return "per_node"
    raise ValueError(
        f"graph policies support Discrete({D}) (one unit's device), Discrete({N * D}) "
        f"(unit x device) or MultiDiscrete([{D}] * {N}) (every unit) for this observation "
        f"(max_nodes={N}, max_devices={D}); got {action_space}"
    )


def scores_to_logits(scores: Tensor, g: DenseGraph, mode: str) -> Tensor:
    """Logits ``(B, A)`` of the action distribution from scores ``(B, N, D)``."""
    if mode == "current_row":
        cur = g.current.argmax(dim=1)  # a sample with no current unit reads row 0
        return scores[torch.arange(scores.shape[0], device=scores.device), cur]
    if mode in ("flat", "per_node"):
        return scores.reshape(scores.shape[0], -1)
    raise ValueError(f"unknown action mode {mode!r}; expected one of {ACTION_MODES}")


class GraphActorCriticPolicy(MaskableActorCriticPolicy):
    """Actor-critic policy over padded graph observations, for ``PPO`` and ``MaskablePPO``.

    A :class:`~agents.policies.base.PlacementNet` (chosen by the class attribute
    ``network``) scores every (unit, device) pair and values the state; the
    scores are read as the logits of the env's action space (see
    :func:`action_mode`) and masked by ``action_masks()`` when MaskablePPO
    passes them. SB3's ``net_arch`` and features extractor are not used.

    Args:
        observation_space: the ``spaces.Dict`` of ``placement_env.encoding``.
        action_space: ``Discrete`` or ``MultiDiscrete`` (see :func:`action_mode`).
        lr_schedule: learning-rate schedule (SB3).
        net_kwargs: keyword arguments of the network (``hidden``, ``num_layers``, ...).
        **kwargs: the other :class:`MaskableActorCriticPolicy` arguments.
    """

    network: ClassVar[str] = ""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        net_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(observation_space, spaces.Dict):
            raise ValueError(
                f"{type(self).__name__} needs a spaces.Dict observation, got {observation_space}"
            )
        self.net_kwargs = dict(net_kwargs or {})
        self.dims = obs_dims(
            {k: int(np.prod(s.shape)) for k, s in observation_space.spaces.items()}
        )
        self.mode = action_mode(action_space, self.dims["max_nodes"], self.dims["max_devices"])
        if kwargs.pop("use_sde", False):
            raise ValueError(f"{type(self).__name__} has discrete actions: use_sde must be False")
        for unused in ("log_std_init", "full_std", "use_expln", "squash_output"):
            kwargs.pop(unused, None)  # PPO passes its continuous-action options to every policy
        kwargs.setdefault("ortho_init", False)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    # ----------------------------------------------------------------- build
    def _build(self, lr_schedule: Schedule) -> None:
        from agents.policies import network_class

        net_cls = network_class(self.network)
        in_dims = {k: self.dims[k] for k in ("node_dim", "edge_dim", "dev_dim", "link_dim")}
        self.net: PlacementNet = net_cls(**in_dims, **self.net_kwargs)
        self.optimizer = self.optimizer_class(
            self.parameters(),
            lr=lr_schedule(1),  # type: ignore[call-arg]
            **self.optimizer_kwargs,
        )

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["net_kwargs"] = self.net_kwargs
        return data

    # ------------------------------------------------------------- evaluate
    def dense(self, obs: PyTorchObs) -> DenseGraph:
        """The observation batch as a :class:`DenseGraph`."""
        pre = preprocess_obs(obs, self.observation_space, normalize_images=False)
        assert isinstance(pre, dict)
        return dense_from_obs(pre)

    def logits_and_value(self, obs: PyTorchObs) -> tuple[Tensor, Tensor]:
        """Action logits ``(B, A)`` and value ``(B, 1)``."""
        g = self.dense(obs)
        scores, value = self.net(g)
        return scores_to_logits(scores, g, self.mode), value

    def _distribution(self, logits: Tensor, action_masks: Any) -> MaskableDistribution:
        dist = self.action_dist.proba_distribution(action_logits=logits)
        if action_masks is not None:
            dist.apply_masking(action_masks)
        return dist

    def forward(
        self,
        obs: PyTorchObs,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        logits, values = self.logits_and_value(obs)
        dist = self._distribution(logits, action_masks)
        actions = dist.get_actions(deterministic=deterministic)
        log_prob = dist.log_prob(actions)
        return actions.reshape((-1, *self.action_space.shape)), values, log_prob  # type: ignore[misc]

    def evaluate_actions(
        self,
        obs: PyTorchObs,
        actions: Tensor,
        action_masks: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        logits, values = self.logits_and_value(obs)
        dist = self._distribution(logits, action_masks)
        return values, dist.log_prob(actions), dist.entropy()

    def get_distribution(
        self, obs: PyTorchObs, action_masks: np.ndarray | None = None
    ) -> MaskableDistribution:
        logits, _ = self.logits_and_value(obs)
        return self._distribution(logits, action_masks)

    def predict_values(self, obs: PyTorchObs) -> Tensor:
        return self.logits_and_value(obs)[1]


class PlacetoPolicy(GraphActorCriticPolicy):
    """:class:`GraphActorCriticPolicy` with :class:`~agents.policies.placeto.PlacetoNet`."""

    network = "placeto"


class GdpPolicy(GraphActorCriticPolicy):
    """:class:`GraphActorCriticPolicy` with :class:`~agents.policies.gdp.GDPNet`."""

    network = "gdp"


class GdpEnsemblePolicy(GraphActorCriticPolicy):
    """:class:`GraphActorCriticPolicy` with :class:`~agents.policies.ensemble.GDPEnsemble`
    (PPO from an ensemble policy file, e.g. ``init_policy="generalist"``)."""

    network = "gdp_ensemble"
