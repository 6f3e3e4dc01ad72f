"""Export a trained graph policy to one torch file and plan with it zero-shot."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from agents.policies import GraphActorCriticPolicy, network_class
from agents.policies.base import PlacementNet
from agents.policies.dense import dense_from_obs
from agents.policies.sb3 import scores_to_logits
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from placement_env.oracles.base import Oracle

POLICY_FORMAT = "devplace.policy"
POLICY_VERSION = 1
#: The env each action reading plans with (when the training env's id is unknown).
MODE_ENV: dict[str, str] = {
    "current_row": "placement_env/Sweep-v0",
    "flat": "placement_env/Reassign-v0",
    "per_node": "placement_env/OneShot-v0",
}
#: Logit of actions the env's mask forbids: sb3-contrib's value, so actions match SB3's.
ACTION_MASK_LOGIT = -1e8
#: Env constructor options copied from the training env into the export, when it has them.
#: None of them may be per-instance state: ``init`` is kept only as a *name* (``"balanced"``,
#: ...); a per-node warm-start placement belongs to the training graph and is not exported.
ENV_OPTIONS = ("init", "order", "horizon", "oom_penalty", "accept", "restart")
#: Where a policy trained from a per-node warm-start placement starts its episodes instead.
WARM_START_INIT = "balanced"


def _encoding_spec() -> dict[str, list[str]]:
    from placement_env import types

    return {
        "node": list(types.NODE_FEATURES),
        "edge": list(types.EDGE_FEATURES),
        "device": list(types.DEVICE_FEATURES),
        "link": list(types.LINK_FEATURES),
        "global": list(types.GLOBAL_FEATURES),
    }


def _plain(x: Any) -> Any:
    """``x`` with numpy scalars/arrays turned into Python types (for ``weights_only`` files)."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def _training_env(model: Any) -> tuple[str | None, dict[str, Any]]:
    """Env id and options of the model's first training env (``(None, {})`` if unknown)."""
    venv = model.get_env() if hasattr(model, "get_env") else None
    if venv is None:
        return None, {}
    env_id, options = None, {}
    try:
        spec = venv.get_attr("spec", indices=[0])[0]
        if spec is not None:
            env_id = spec.id
            if spec.max_episode_steps is not None:
                options["max_episode_steps"] = int(spec.max_episode_steps)
    except AttributeError:
        pass
    for k in ENV_OPTIONS:
        try:
            options[k] = venv.get_attr(k, indices=[0])[0]
        except AttributeError:
            continue
    return env_id, instance_free(_plain(options))


def instance_free(options: Mapping[str, Any]) -> dict[str, Any]:
    """Env options without per-instance state: a per-node ``init`` placement becomes
    :data:`WARM_START_INIT` (the policy then plans any graph, starting from a balanced split)."""
    out = dict(options)
    if "init" in out and not isinstance(out["init"], str):
        out["init"] = WARM_START_INIT
    return out


def export_policy(model: Any, path: str | Path, *, meta: Mapping[str, Any] | None = None) -> Path:
    """Write a trained policy to ``path``: one file that ``torch.load(..., weights_only=True)`` reads.

    The file is a dict of plain types and tensors: ``format``, ``version``,
    ``network`` (registry name), ``config`` (network constructor arguments),
    ``state_dict``, ``mode`` (how scores become actions), ``env_id`` and
    ``env_options`` (the env the policy plans with), ``features`` (the column
    names of the observation encoding: inputs are normalised by the env's
    encoder, so matching names mean matching normalisation) and ``meta``.

    Args:
        model: a (Maskable)PPO whose policy is a :class:`GraphActorCriticPolicy`,
            or such a policy.
        path: output file (parents are created).
        meta: provenance to store (training instances, budgets, ...), JSON-like.
    """
    payload = policy_payload(model, meta=meta)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def policy_payload(model: Any, *, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plain dict :func:`export_policy` writes (see there for its keys)."""
    policy = getattr(model, "policy", model)
    if not isinstance(policy, GraphActorCriticPolicy):
        raise TypeError(
            f"export_policy needs a model with a GraphActorCriticPolicy, got {type(policy).__name__}"
        )
    env_id, options = _training_env(model)
    return {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "network": policy.network,
        "config": _plain(policy.net.config()),
        "state_dict": {k: v.detach().cpu().clone() for k, v in policy.net.state_dict().items()},
        "mode": policy.mode,
        "env_id": env_id or MODE_ENV[policy.mode],
        "env_options": options,
        "features": _encoding_spec(),
        "meta": _plain(dict(meta or {})),
    }


def load_policy(path: str | Path) -> ExportedPolicy:
    """Read a file written by :func:`export_policy` (safely: ``weights_only=True``)."""
    try:
        d = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refusals and corrupt files alike
        raise ValueError(f"{path}: not a loadable policy file ({exc})") from None
    if not isinstance(d, dict) or d.get("format") != POLICY_FORMAT:
        fmt = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise ValueError(
            f"{path}: not a devplace policy (format={fmt!r}, expected {POLICY_FORMAT!r})"
        )
    return from_payload(d, source=str(path))


def from_payload(d: Mapping[str, Any], *, source: str = "policy") -> ExportedPolicy:
    """The :class:`ExportedPolicy` of a payload (:func:`policy_payload` or a loaded file)."""
    path = source
    if d.get("version") != POLICY_VERSION:
        raise ValueError(
            f"{path}: policy version {d.get('version')!r} is not supported (expected {POLICY_VERSION})"
        )
    now = _encoding_spec()
    for key, names in now.items():
        saved = d["features"].get(key)
        if saved != names:
            raise ValueError(
                f"{path}: the policy was trained on {key} features {saved}, but the observation "
                f"encoding now has {names}; retrain or re-export it"
            )
    net = network_class(d["network"])(**d["config"])
    net.load_state_dict(d["state_dict"])
    return ExportedPolicy(
        net.eval(),
        network=d["network"],
        mode=d["mode"],
        env_id=d["env_id"],
        env_options=instance_free(d.get("env_options") or {}),  # files from before the fix
        meta=dict(d.get("meta") or {}),
    )


class ExportedPolicy:
    """A trained placement network detached from SB3, planning any graph on any cluster.

    Attributes:
        net: the network (eval mode).
        network: its registry name (``"placeto"``, ``"gdp"``).
        mode: how scores become actions (``"current_row"``, ``"flat"``, ``"per_node"``).
        env_id: the env whose episodes :meth:`plan` rolls out.
        env_options: that env's options at training time (``order``, ``accept``, ...; ``init``
            only as a name): nothing tied to one graph, so any graph and cluster can be planned.
        meta: provenance stored at export.
    """

    def __init__(
        self,
        net: PlacementNet,
        *,
        network: str,
        mode: str,
        env_id: str,
        env_options: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.net = net
        self.network = network
        self.mode = mode
        self.env_id = env_id
        self.env_options = dict(env_options or {})
        self.meta = dict(meta or {})

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def logits(self, obs: Mapping[str, Any]) -> Tensor:
        """Action logits ``(B, A)`` for flat observations (one dict, optionally batched)."""
        t = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items()}
        g = dense_from_obs(t)
        scores, _ = self.net(g)
        return scores_to_logits(scores, g, self.mode)

    def predict(
        self,
        obs: Mapping[str, Any],
        action_masks: np.ndarray | None = None,
        *,
        deterministic: bool = True,
        rng: torch.Generator | None = None,
    ) -> np.ndarray:
        """Actions for ``obs`` like SB3's ``predict``: ``(B,)`` or ``(B, max_nodes)`` for OneShot."""
        logits = self.logits(obs)
        B = logits.shape[0]
        if self.mode == "per_node":  # one categorical per unit
            groups = logits.view(B, int(np.asarray(obs["node_mask"]).shape[-1]), -1)
        else:
            groups = logits.view(B, 1, -1)
        if action_masks is not None:
            m = torch.as_tensor(np.asarray(action_masks, dtype=bool)).view(groups.shape)
            groups = groups.masked_fill(~m, ACTION_MASK_LOGIT)
        if deterministic:
            act = groups.argmax(-1)
        else:
            probs = torch.softmax(groups.double(), dim=-1).view(-1, groups.shape[-1])
            act = torch.multinomial(probs, 1, generator=rng).view(groups.shape[:-1])
        a = act.numpy()
        return a.reshape(B) if self.mode != "per_node" else a

    # ---------------------------------------------------------------- planning
    def make_env(self, graph: CompGraph, cluster: Cluster, oracle: Oracle) -> gym.Env:
        """The env of :attr:`env_id` on this one instance, padded exactly, scored by ``oracle``."""
        from placement_env.encoding import instance_bounds
        from placement_env.generators import fixed

        b = instance_bounds(graph, cluster)
        opts = dict(self.env_options)
        steps = opts.pop("max_episode_steps", None)
        kw: dict[str, Any] = {}
        if steps is not None:
            kw["max_episode_steps"] = int(steps)
        return gym.make(
            self.env_id,
            generator=fixed(graph, cluster),
            oracle_factory=lambda g, c: oracle,
            max_nodes=b.max_nodes,
            max_edges=b.max_edges,
            max_devices=b.max_devices,
            **opts,
            **kw,
            disable_env_checker=True,
        )

    def plan(
        self,
        graph: CompGraph,
        cluster: Cluster,
        *,
        microbatches: int = 8,
        schedule: str = "1f1b",
        greedy: bool = True,
        samples: int = 1,
        oracle: Oracle | None = None,
        seed: int = 0,
    ) -> Plan:
        """Place ``graph`` on ``cluster`` with no training: roll out ``samples`` episodes.

        Episode ``k`` is greedy when ``greedy`` and ``k == 0``, sampled otherwise;
        every placement the env evaluates is scored by the oracle and the
        fastest memory-feasible one is returned.

        Args:
            graph, cluster: the problem (any size within the network's reach).
            microbatches, schedule: the simulator's settings when ``oracle`` is None.
            greedy: take the most likely action in the first episode.
            samples: episodes to roll out (>= 1).
            oracle: scores placements (default: ``Simulator(graph, cluster, ...)``).
            seed: seeds the env (initial placements) and the sampling.

        Raises:
            agents.baselines.InfeasiblePlanError: every evaluated placement ran out of memory.
        """
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if oracle is None:
            from placement_env.oracles.simulator import Simulator

            oracle = Simulator(graph, cluster, microbatches=microbatches, schedule=schedule)
        t0 = time.perf_counter()
        calls0 = int(getattr(oracle, "calls", 0))
        env = self.make_env(graph, cluster, oracle)
        rng = torch.Generator().manual_seed(seed)
        best_t, best_p = float("inf"), None
        try:
            for k in range(samples):
                obs, info = env.reset(seed=seed + k)
                done = False
                while True:
                    t = float(info.get("step_time", float("nan")))
                    scored = info.get("scored", True)  # step_time is of this placement
                    if np.isfinite(t) and scored and not info["oom"] and t < best_t:
                        if (np.asarray(info["placement"]) >= 0).all():
                            best_t, best_p = t, np.asarray(info["placement"]).copy()
                    if done:
                        break
                    mask = env.unwrapped.action_masks()  # type: ignore[attr-defined]
                    greedy_now = greedy and k == 0
                    if greedy_now and self.proposes_moves:
                        mask = _without_current_device(env.unwrapped, mask)
                    batch = {key: v[None] for key, v in obs.items()}
                    a = self.predict(batch, mask[None], deterministic=greedy_now, rng=rng)
                    obs, _, term, trunc, info = env.step(a[0])
                    done = term or trunc
        finally:
            env.close()
        if best_p is None:
            from agents.baselines import InfeasiblePlanError

            raise InfeasiblePlanError(
                f"policy {self.network!r} found no memory-feasible placement of "
                f"{graph.meta.get('name', '?')!r} on {cluster.name!r} in {samples} episode(s)"
            )
        return Plan.for_graph(
            best_p,
            graph,
            cluster,
            microbatches=int(getattr(oracle, "microbatches", microbatches)),
            schedule=str(getattr(oracle, "schedule", schedule)),
            meta={
                "algorithm": f"ppo-{self.network}",
                "step_time": best_t,
                "oracle_calls": int(getattr(oracle, "calls", 0)) - calls0,
                "search_seconds": time.perf_counter() - t0,
                "greedy": greedy,
                "samples": samples,
                "env_id": self.env_id,
            },
        )

    @property
    def proposes_moves(self) -> bool:
        """The policy is a local search's proposal (a ``Sweep-v0`` with ``accept="improve"``):
        its greedy episode takes, for each unit, its most likely device *other than* the
        current one, and the env undoes the moves that make the plan slower. (Its argmax
        including the current device is nearly always "keep", an episode that changes nothing.)"""
        return self.mode == "current_row" and self.env_options.get("accept") == "improve"

    def __repr__(self) -> str:
        return f"ExportedPolicy({self.net!r}, mode={self.mode!r}, env_id={self.env_id!r})"


def _without_current_device(env: Any, mask: np.ndarray) -> np.ndarray:
    """``mask`` with the current unit's own device removed, unless it is the only choice."""
    st = getattr(env, "state", None)
    if st is None or st.current < 0:
        return mask
    d = int(st.placement[st.current])
    if 0 <= d < mask.size and mask.sum() > 1:
        mask = mask.copy()
        mask[d] = False
    return mask
