"""Export a trained graph policy to one torch file and plan with it zero-shot."""

from __future__ import annotations

import inspect
import pickle
import re
import time
import typing
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from agents.policies import GraphActorCriticPolicy, network_class, network_names
from agents.policies.base import PlacementNet
from agents.policies.dense import dense_from_obs
from agents.policies.sb3 import scores_to_logits
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import Fields, check_path, is_number, is_whole, show
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
#: Largest integer a network's config may hold (sizes, layer counts).
MAX_CONFIG_INT = 2**20
#: Env constructor options copied from the training env into the export, when it has them.
#: None of them may be per-instance state: ``init`` is kept only as a *name* (``"balanced"``,
#: ...); a per-node warm-start placement belongs to the training graph and is not exported.
ENV_OPTIONS = ("init", "order", "horizon", "oom_penalty", "accept", "restart")
#: Where a policy trained from a per-node warm-start placement starts its episodes instead.
WARM_START_INIT = "balanced"
#: Placements ``python -m runners.plan`` scores when ``samples`` is not given, by decoding:
#: chain decoding (per-unit policies such as the generalist) samples cheaply, so the
#: largest power of two that planned every training row of ``docs/generalisation.md`` in
#: under 1 s on the 2-core reference machine (1024: at most 0.66 s; 2048 took 1.35 s);
#: episode rollouts cost an env step per unit, so 16.
DEFAULT_SAMPLES = {"chain": 1024, "independent": 16}


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
    path = check_path(path, "export_policy: path")
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
    return network_payload(
        policy.net,
        network=policy.network,
        mode=policy.mode,
        env_id=env_id or MODE_ENV[policy.mode],
        env_options=options,
        meta=meta,
    )


def network_payload(
    net: PlacementNet,
    *,
    network: str,
    mode: str,
    env_id: str,
    env_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The policy-file dict of a network (:func:`export_policy` lists the keys)."""
    return {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "network": network,
        "config": _plain(net.config()),
        "state_dict": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        "mode": mode,
        "env_id": env_id,
        "env_options": _plain(dict(env_options or {})),
        "features": _encoding_spec(),
        "meta": _plain(dict(meta or {})),
    }


def resolve_policy(path: str | Path) -> Path:
    """The file of a policy: a shipped name (``"generalist"``, under ``agents/pretrained/``)
    unless a *file* of that name exists, else ``path`` itself. A folder of that name never
    shadows it: a run folder ``generalist/`` (``output_dir=generalist``) in the current
    folder made ``runners.plan`` without ``policy=`` fail with "generalist is a folder"
    (4 Dec 2026)."""
    from agents.generalist import shipped_path

    p = check_path(path, "policy", "a shipped policy name or a file path")
    if not str(path).strip():  # Path("") is ".": "error: .: not a loadable policy file"
        raise ValueError(
            "policy is empty; expected a shipped policy name ('generalist') or a policy file, "
            "e.g. outputs/train/DATE/TIME/policy.pt"
        )
    shipped = shipped_path(str(path))
    if shipped is not None and not p.is_file():
        if not shipped.exists():
            raise ValueError(f"policy {str(path)!r}: the shipped file {shipped} is missing")
        return shipped
    return p


def _read_policy_file(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` with refusals that name the file and never
    suggest ``weights_only=False`` (that would run whatever the file's pickle says)."""
    if path.is_dir():  # "(no such file)" for a run folder (fuzzing)
        inside = sorted(f.name for f in path.glob("*.pt"))
        raise ValueError(
            f"{path} is a folder; policy= takes a policy file"
            + (
                f": {path / inside[0]}?"
                if len(inside) == 1
                else f" (it holds {inside})"
                if inside
                else " (it holds no .pt file)"
            )
        )
    if not path.is_file():
        raise ValueError(f"{path}: not a loadable policy file (no such file)")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            head = fh.read(24)
        raise ValueError(
            f"{path}: not a loadable policy file: field '(top level)' is {show(head)}; expected "
            "the (complete) zip archive torch.save writes, made by agents.export_policy or "
            "runners.train"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"the Python object {found[1]}" if found else "Python objects"
        raise ValueError(
            f"{path}: not a loadable policy file: it holds {what}, not only tensors and plain "
            "values; refused unread (a devplace policy holds only those)"
        ) from None
    except Exception as exc:  # corrupt or truncated archives: torch raises several types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in first:
            first = type(exc).__name__
        raise ValueError(
            f"{path}: not a loadable policy file (corrupt or truncated torch file: {first})"
        ) from None


def _check_policy(d: Any, f: Fields) -> None:
    """The schema of an exported policy (see :func:`export_policy`); ``ValueError`` naming
    the file, the field and the value."""
    if not isinstance(d, dict):
        raise ValueError(
            f"{f.source}: not a devplace policy: field '(top level)' is {show(d)}; expected "
            f"an object with format {POLICY_FORMAT!r}"
        )
    if d.get("format") != POLICY_FORMAT:
        raise ValueError(
            f"{f.source}: not a devplace policy: field 'format' is {show(d.get('format'))}; "
            f"expected {POLICY_FORMAT!r}"
        )
    if not (type(d.get("version")) is int and d["version"] == POLICY_VERSION):
        v = show(d.get("version"))
        raise ValueError(
            f"{f.source}: field 'version' is {v}: policy version {v} is not supported "
            f"(expected {POLICY_VERSION})"
        )
    f.obj(
        d,
        "",
        required=(
            "format",
            "version",
            "network",
            "config",
            "state_dict",
            "mode",
            "env_id",
            "env_options",
            "features",
        ),
        optional=("meta",),
    )
    f.depth({k: v for k, v in d.items() if k != "state_dict"})  # nesting, NaN, inf
    f.string(d["network"], "network", choices=network_names())
    _check_config(f, network_class(d["network"]), f.obj(d["config"], "config", free=True))
    sd = f.obj(d["state_dict"], "state_dict", free=True)
    if not sd:
        raise f.error("state_dict", sd, "the network's weights (tensors by parameter name)")
    for k, t in sd.items():
        if not isinstance(t, Tensor):
            raise f.error(f"state_dict.{k}", t, "a tensor")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = t[~torch.isfinite(t)]
            raise f.fail(
                f"state_dict.{k}",
                f"holds {bad.numel()} NaN or infinite weights (first: {float(bad[0])}); "
                "expected finite weights: re-export the policy",
            )
    mode = f.string(d["mode"], "mode", choices=MODE_ENV)
    env_id = f.string(d["env_id"], "env_id")
    if env_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("placement_env/"))
        raise f.error("env_id", env_id, f"a registered env id {known}")
    if env_id != MODE_ENV[mode]:  # the actions of one mode are another env's nonsense
        raise f.error("env_id", env_id, f"{MODE_ENV[mode]!r}, the env of mode {mode!r}")
    opts = f.obj(d["env_options"], "env_options", optional=(*ENV_OPTIONS, "max_episode_steps"))
    from placement_env import env_keywords

    takes = env_keywords(env_id)
    for k, v in opts.items():
        if not _plain_value(v):
            raise f.error(f"env_options.{k}", v, "a plain value (number, string, list, object)")
        if takes is not None and k != "max_episode_steps" and k not in takes:
            raise f.fail(
                f"env_options.{k}", f"is not an option of {env_id} (value {show(v)}); "
                f"valid: {sorted(o for o in ENV_OPTIONS if o in takes)}",
            )  # fmt: skip
    if "oom_penalty" in opts:
        f.number(opts["oom_penalty"], "env_options.oom_penalty", lo=0)
    for k in ("accept", "restart", "order"):  # (init: a per-node list in old files)
        if k in opts and not isinstance(opts[k], (str, bool, int, float)) and opts[k] is not None:
            raise f.error(f"env_options.{k}", opts[k], "a name or a number")
    if "max_episode_steps" in opts:
        f.integer(opts["max_episode_steps"], "env_options.max_episode_steps", lo=1, hi=2**31)
    feats = f.obj(d["features"], "features", required=_encoding_spec())
    for key, names in feats.items():
        f.unique(
            f.array(names, f"features.{key}", f.string, what="feature names"), f"features.{key}"
        )
    if d.get("meta") is not None:
        f.obj(d["meta"], "meta", free=True)


def _check_config(f: Fields, cls: type, config: Mapping[str, Any]) -> None:
    """``config`` holds only constructor arguments of ``cls`` (and its bases), each of the
    annotated type, integers in ``[0, 2**20]``: a typo or a huge size is refused by name."""
    hints: dict[str, Any] = {}
    required: set[str] = set()
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None or not issubclass(klass, PlacementNet):
            continue
        types = typing.get_type_hints(init)
        for name, p in inspect.signature(init).parameters.items():
            if name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            hints[name] = types.get(name, Any)
            if p.default is p.empty:
                required.add(name)
    for k, v in config.items():
        path = f"config.{k}"
        if k not in hints:
            raise f.fail(
                path,
                f"is not an argument of {cls.__name__} (value {show(v)}); valid: {sorted(hints)}",
            )
        tp = hints[k]
        if tp is int:
            f.integer(v, path, lo=0, hi=MAX_CONFIG_INT)
        elif tp is float:
            f.number(v, path)
        elif tp is bool:
            f.boolean(v, path)
        elif tp is str:
            f.text(v, path)
        elif not _plain_value(v):
            raise f.error(path, v, "a plain value (number, string, list, object)")
    for k in sorted(required - set(config)):
        raise f.fail(f"config.{k}", f"is missing (an argument of {cls.__name__})")


def _plain_value(v: Any) -> bool:
    """True for JSON-like values (what :func:`_plain` writes)."""
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _plain_value(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return all(_plain_value(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def load_policy(path: str | Path) -> ExportedPolicy:
    """Read a file written by :func:`export_policy`, safely: only tensors and plain values are
    unpickled (``weights_only=True``), then every field is checked (see :func:`from_payload`)
    before the network is built. ``ValueError`` naming the file, the field and the value.

    ``path`` may name a shipped policy: ``load_policy("generalist")`` reads the pretrained
    generalist that ships in ``agents/pretrained/`` (see ``docs/generalisation.md``).
    """
    given, path = path, resolve_policy(path)
    try:
        return from_payload(_read_policy_file(path), source=str(path))
    except ValueError as exc:
        from agents.generalist import shipped_path

        if shipped_path(str(given)) is not None and Path(given).is_file():
            # a stray file of a shipped policy's name took its place (fuzzing, 2 Dec 2026)
            raise ValueError(
                f"{exc} (a file named {str(given)!r} in {Path.cwd()} is read instead of the "
                f"shipped policy; rename it, or give the shipped file {shipped_path(str(given))})"
            ) from None
        raise


def from_payload(d: Any, *, source: str = "policy") -> ExportedPolicy:
    """The :class:`ExportedPolicy` of a payload (:func:`policy_payload` or a loaded file),
    every field checked first (:func:`_check_policy`): ``ValueError`` naming ``source``, the
    field and the value."""
    f = Fields(source)
    _check_policy(d, f)
    now = _encoding_spec()
    for key, names in now.items():
        saved = d["features"].get(key)
        if saved != names:
            raise ValueError(
                f"{source}: field 'features.{key}' is {show(saved)}: the policy was trained on "
                f"{key} features {saved}, but the observation encoding now has {names}; "
                "retrain or re-export it"
            )
    # the network's input widths follow from the features (agents.policies.dense: the node
    # input is a unit's features plus the global ones); a file whose widths differ loaded
    # and then failed at planning with torch's "mat1 and mat2 shapes" (found by fuzzing)
    widths = {
        "node_dim": len(now["node"]) + len(now["global"]), "edge_dim": len(now["edge"]),
        "dev_dim": len(now["device"]), "link_dim": len(now["link"]),
    }  # fmt: skip
    cfg = d["config"] if isinstance(d.get("config"), dict) else {}
    for key, want in widths.items():
        if key in cfg and cfg[key] != want:
            raise f.fail(
                f"config.{key}",
                f"is {show(cfg[key])}; the features it was trained on give {want} inputs",
            )
    try:
        net = network_class(d["network"])(**d["config"])
    except (TypeError, ValueError) as exc:
        raise f.fail("config", f"does not build a {d['network']!r} network ({exc})") from None
    want = net.state_dict()
    for k, t in d["state_dict"].items():
        if k not in want:
            raise f.fail(f"state_dict.{k}", f"is not a weight of the {d['network']!r} network")
        if tuple(t.shape) != tuple(want[k].shape):
            raise f.fail(
                f"state_dict.{k}",
                f"has shape {tuple(t.shape)}; expected {tuple(want[k].shape)} (from 'config')",
            )
        if t.dtype != want[k].dtype:  # int weights were truncated copies, half ones rounded
            raise f.fail(
                f"state_dict.{k}",
                f"has dtype {str(t.dtype).removeprefix('torch.')}; expected "
                f"{str(want[k].dtype).removeprefix('torch.')} (what export_policy writes)",
            )
    for k in want:
        if k not in d["state_dict"]:
            raise f.fail(
                f"state_dict.{k}", f"is missing (a weight of the {d['network']!r} network)"
            )
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

    def save(self, path: str | Path) -> Path:
        """Write this policy (its current weights: e.g. after fine-tuning) to ``path`` in the
        format :func:`export_policy` writes and :func:`load_policy` reads."""
        payload = network_payload(
            self.net,
            network=self.network,
            mode=self.mode,
            env_id=self.env_id,
            env_options=self.env_options,
            meta=self.meta,
        )
        path = check_path(path, "ExportedPolicy.save: path")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(payload, path)
        return path

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
        # greedy decoding took the argmax of overflowing scores and returned a plan (the
        # sampled path refused them; fuzzing, 2 Dec 2026): both refuse now
        if not bool(torch.isfinite(groups).all()):
            raise ValueError(
                "the policy's scores on this instance are not finite (overflowing weights?); "
                "re-export or retrain the policy"
            )
        if deterministic:
            act = groups.argmax(-1)
        else:
            # finite scores give finite probabilities (softmax subtracts the largest)
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
        try:
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
        except (TypeError, ValueError) as exc:  # a bad value among the file's env_options
            from placement_env import creator_error

            raise ValueError(
                f"the policy's env_options {opts} do not make a {self.env_id} env: "
                f"{creator_error(exc)}"
            ) from None

    def default_samples(self) -> int:
        """How many placements to score when the caller does not say
        (:data:`DEFAULT_SAMPLES` of this policy's default decoding)."""
        return DEFAULT_SAMPLES["chain" if self.mode == "per_node" else "independent"]

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
        decode: str | None = None,
        penalty: float | Sequence[float] | None = None,
        temperature: float | None = None,
        link_exponent: float | None = None,
        progress: bool = False,
    ) -> Plan:
        """Place ``graph`` on ``cluster`` with no training: ``samples`` placements, the best kept.

        Per-unit policies (``mode == "per_node"``, the generalist) decode by default as a
        **chain** (:mod:`agents.decoding`): the units, in topological order, with the network's
        per-unit device distributions and a ``penalty`` (nats) per device change between
        consecutive units. Placement 0 is the chain's most likely one (exact Viterbi) when
        ``greedy``; the others are exact samples of the same chain model (distinct ones
        only are scored). ``decode="independent"`` (and every other mode) rolls out
        ``samples`` env episodes instead: episode ``k`` greedy when ``greedy`` and ``k ==
        0``, sampled otherwise. Either way every placement is scored by the oracle and the
        fastest memory-feasible one is returned.

        Args:
            graph, cluster: the problem (any size within the network's reach).
            microbatches, schedule: the simulator's settings when ``oracle`` is None.
            greedy: take the most likely action in the first episode.
            samples: episodes to roll out (>= 1).
            oracle: scores placements (default: ``Simulator(graph, cluster, ...)``).
            seed: seeds the env (initial placements) and the sampling.
            decode: ``"chain"`` (default for per-unit policies) or ``"independent"``.
            penalty: chain decoding's device-change penalty (default: the file's
                ``meta["decode_penalty"]``, else :data:`agents.decoding.DEFAULT_PENALTY`),
                or a ladder of penalties: the Viterbi placement of each, then the samples
                shared out over them (:func:`agents.decoding.candidates`).
            temperature: chain decoding's sampling temperature: the samples (not the Viterbi
                placements) come from the chain model of the log-probabilities divided by it
                (default: the file's ``meta["decode_temperature"]``, else
                :data:`agents.decoding.DEFAULT_TEMPERATURE`, 1: the network's own
                distributions).
            link_exponent: link-aware chain decoding: a device change ``a -> b`` costs the
                penalty times ``(best bandwidth / bandwidth(a, b)) ** link_exponent``
                (:func:`agents.decoding.link_weights`; default: the file's
                ``meta["decode_link_exponent"]``, else
                :data:`agents.decoding.DEFAULT_LINK_EXPONENT`, 0: every change the same).
            progress: show a progress bar (tqdm, on stderr) over the placements scored
                (chain decoding) or the episodes (independent decoding).

        Raises:
            agents.baselines.InfeasiblePlanError: every evaluated placement ran out of memory.
        """
        if not is_whole(samples, 1):
            raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
        if not is_whole(seed, 0):
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        seed = int(seed)  # a numpy integer failed inside gymnasium's reset (fuzzing)
        samples = int(samples)
        if temperature is not None and not is_number(temperature, 0.0, lo_open=True):
            # True was taken as 1.0 and "0.5" as 0.5 (fuzzing, 2 Dec 2026)
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        if not isinstance(greedy, (bool, np.bool_)):
            raise ValueError(f"greedy must be True or False, got {greedy!r}")
        if not isinstance(progress, (bool, np.bool_)):
            raise ValueError(f"progress must be True or False, got {progress!r}")
        # a string was converted ('2' taken as 2.0, 'abc' a bare float() error; fuzzing)
        pens = [penalty] if penalty is None or np.isscalar(penalty) else list(penalty)
        if not pens or not all(p is None or is_number(p, 0.0) for p in pens):
            raise ValueError(f"penalty must be a number >= 0 or a list of them, got {penalty!r}")
        if link_exponent is not None and not is_number(link_exponent, 0.0):
            raise ValueError(f"link_exponent must be a number >= 0, got {link_exponent!r}")
        if oracle is not None:
            _check_oracle_problem(oracle, graph, cluster)
        if oracle is None:
            from placement_env.oracles.simulator import Simulator

            oracle = Simulator(graph, cluster, microbatches=microbatches, schedule=schedule)
        if decode is None:
            decode = "chain" if self.mode == "per_node" else "independent"
        if decode not in ("chain", "independent"):
            raise ValueError(f"decode must be 'chain' or 'independent', got {decode!r}")
        if decode == "chain" and self.mode != "per_node":
            raise ValueError(f"chain decoding needs a per-unit policy, not mode {self.mode!r}")
        for name, value in (
            ("temperature", temperature), ("link_exponent", link_exponent), ("penalty", penalty)
        ):  # fmt: skip
            if value is not None and decode != "chain":  # penalty was ignored (fuzzing)
                raise ValueError(
                    f"{name}={value!r} is for chain decoding; this plan decodes "
                    f"{decode!r} (policy mode {self.mode!r})"
                )
        t0 = time.perf_counter()
        calls0 = int(getattr(oracle, "calls", 0))
        env = self.make_env(graph, cluster, oracle)
        extra: dict[str, Any] = {}
        if decode == "chain":
            # the bar is up while the network reads the problem and the samples are drawn
            # (about 9 s of 61 for 100,000 samples of bert_8gpu), then counts placements scored
            bar = _progress_bar(progress, samples, "placement", desc="plan (drawing samples)")
            try:
                best_t, best_p, extra = self._plan_chain(
                    env,
                    oracle,
                    greedy=greedy,
                    samples=samples,
                    seed=seed,
                    penalty=penalty,
                    temperature=temperature,
                    link_exponent=link_exponent,
                    cluster=cluster,
                    bar=bar,
                )
            finally:
                bar.close()
                env.close()
        else:
            best_t, best_p = self._plan_episodes(
                env, greedy=greedy, samples=samples, seed=seed, progress=bool(progress)
            )
        if best_p is None:
            from agents.baselines import InfeasiblePlanError

            raise InfeasiblePlanError(
                f"policy {self.network!r} found no memory-feasible placement of "
                f"{graph.meta.get('name', '?')!r} on {cluster.name!r} in {samples} "
                f"{'placement' if decode == 'chain' else 'episode'}(s)"
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
                "decode": decode,
                **extra,
                "env_id": self.env_id,
            },
        )

    def _plan_chain(
        self,
        env: gym.Env,
        oracle: Oracle,
        *,
        greedy: bool,
        samples: int,
        seed: int,
        penalty: float | Sequence[float] | None,
        temperature: float | None = None,
        link_exponent: float | None = None,
        cluster: Cluster,
        bar: Any,
    ) -> tuple[float, np.ndarray | None, dict[str, Any]]:
        """Chain decoding (see :meth:`plan`): ``(best step time, node placement, meta)``;
        ``bar`` (:func:`_progress_bar`) advanced once per placement."""
        from agents import decoding

        if penalty is None:
            penalty = self.meta.get("decode_penalty", decoding.DEFAULT_PENALTY)
        penalty = float(penalty) if np.isscalar(penalty) else [float(p) for p in penalty]
        temperature = self.decode_temperature() if temperature is None else float(temperature)
        obs, enc, mask = chain_inputs(env, seed)
        U, D = mask.shape
        link_exponent, weights = self.decode_link_weights(cluster, link_exponent)
        if weights is not None and weights.shape != (D, D):
            raise ValueError("link-aware chain decoding needs the cluster of the env's devices")
        N = int(np.asarray(obs["node_mask"]).shape[-1])
        logits = self.logits({k: v[None] for k, v in obs.items()}).view(N, -1).numpy()
        logp = decoding.masked_log_probs(logits[:U, :D], mask)
        cands = decoding.candidates(
            logp,
            penalty,
            samples,
            greedy=greedy,
            rng=np.random.default_rng(seed),
            temperature=temperature,
            weights=weights,
        )
        best_t, best_p, seen = float("inf"), None, set()
        bar.set_description_str("plan", refresh=False)
        for units in cands:
            bar.update(1)
            key = units.tobytes()
            if key in seen:  # a repeated sample costs no oracle call
                continue
            seen.add(key)
            node_pl = enc.units.node_placement(units)
            res = oracle.evaluate(node_pl)
            t = float(res.step_time)
            if not res.oom and np.isfinite(t) and t < best_t:
                best_t, best_p = t, np.asarray(node_pl, dtype=np.int64).copy()
                bar.set_postfix_str(f"best {best_t * 1e3:.3f} ms", refresh=False)
        return (
            best_t,
            best_p,
            {
                "penalty": penalty,
                "temperature": temperature,
                "link_exponent": link_exponent,
                "distinct_placements": len(seen),
            },
        )

    def decode_link_weights(
        self, cluster: Cluster, link_exponent: float | None = None
    ) -> tuple[float, np.ndarray | None]:
        """``(exponent, weights)`` of link-aware chain decoding on ``cluster``: the exponent
        given, else the file's ``meta["decode_link_exponent"]``, else
        :data:`agents.decoding.DEFAULT_LINK_EXPONENT`; the weights of
        :func:`agents.decoding.link_weights`, ``None`` for exponent 0 (every change alike)."""
        from agents import decoding

        if link_exponent is None:
            link_exponent = self.meta.get("decode_link_exponent", decoding.DEFAULT_LINK_EXPONENT)
        e = float(link_exponent)
        return e, (decoding.link_weights(cluster, e) if e != 0.0 else None)

    def decode_temperature(self) -> float:
        """Chain decoding's sampling temperature when a call gives none: the file's
        ``meta["decode_temperature"]``, else :data:`agents.decoding.DEFAULT_TEMPERATURE`."""
        from agents import decoding

        return float(self.meta.get("decode_temperature", decoding.DEFAULT_TEMPERATURE))

    def _plan_episodes(
        self, env: gym.Env, *, greedy: bool, samples: int, seed: int, progress: bool = False
    ) -> tuple[float, np.ndarray | None]:
        """Env episodes (see :meth:`plan`): ``(best step time, node placement)``."""
        rng = torch.Generator().manual_seed(seed)
        best_t, best_p = float("inf"), None
        bar = _progress_bar(progress, samples, "episode")
        try:
            for k in range(samples):
                bar.update(1)
                obs, info = env.reset(seed=seed + k)
                done = False
                while True:
                    t = float(info.get("step_time", float("nan")))
                    scored = info.get("scored", True)  # step_time is of this placement
                    if np.isfinite(t) and scored and not info["oom"] and t < best_t:
                        if (np.asarray(info["placement"]) >= 0).all():
                            best_t, best_p = t, np.asarray(info["placement"]).copy()
                            bar.set_postfix_str(f"best {best_t * 1e3:.3f} ms", refresh=False)
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
            bar.close()
            env.close()
        return best_t, best_p

    @property
    def proposes_moves(self) -> bool:
        """The policy is a local search's proposal (a ``Sweep-v0`` with ``accept="improve"``):
        its greedy episode takes, for each unit, its most likely device *other than* the
        current one, and the env undoes the moves that make the plan slower. (Its argmax
        including the current device is nearly always "keep", an episode that changes nothing.)"""
        return self.mode == "current_row" and self.env_options.get("accept") == "improve"

    def __repr__(self) -> str:
        return f"ExportedPolicy({self.net!r}, mode={self.mode!r}, env_id={self.env_id!r})"


def _progress_bar(show: bool, total: int, unit: str, desc: str = "plan") -> Any:
    """A tqdm bar over ``total`` ``unit``s on stderr, or, when not ``show``, one that draws
    nothing."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, unit=unit, desc=desc, mininterval=0.5, dynamic_ncols=True,
        disable=not show,
    )  # fmt: skip


def _check_oracle_problem(oracle: Any, graph: CompGraph, cluster: Cluster) -> None:
    """Refuse an oracle built for another graph or cluster than the one to plan (it would
    score placements of the wrong problem, or fail on array shapes far from the cause)."""
    if not callable(getattr(oracle, "evaluate", None)):
        # oracle="sim" was "'str' object has no attribute 'evaluate'" (fuzzing, 2 Dec 2026)
        raise ValueError(
            f"oracle must be an oracle object with .evaluate (e.g. placement_env.oracles."
            f"Simulator(graph, cluster)) or None for the simulator, got {oracle!r}"
        )
    og, oc = getattr(oracle, "graph", None), getattr(oracle, "cluster", None)
    if oc is not None and oc is not cluster and oc.content_hash() != cluster.content_hash():
        raise ValueError(
            f"oracle is for cluster {oc.name!r} ({oc.num_devices} devices), not the cluster "
            f"to plan {cluster.name!r} ({cluster.num_devices} devices)"
        )
    if og is not None and og is not graph and og.content_hash() != graph.content_hash():
        raise ValueError(
            f"oracle is for graph {og.meta.get('name', '?')!r} ({og.num_nodes} nodes), not the "
            f"graph to plan {graph.meta.get('name', '?')!r} ({graph.num_nodes} nodes)"
        )


def chain_inputs(env: gym.Env, seed: int) -> tuple[dict[str, Any], Any, np.ndarray]:
    """What chain decoding reads from a per-unit env after ``reset(seed=seed)``: the
    observation, the encoder (``enc.units`` maps unit placements to node placements) and
    the ``(units, devices)`` action mask, a unit that no device allows opened to all of them
    (as :func:`agents.decoding.masked_log_probs` does)."""
    obs, _ = env.reset(seed=seed)
    enc = env.unwrapped.enc  # type: ignore[attr-defined]
    U, D = int(enc.num_units), int(enc.num_devices)
    N = int(np.asarray(obs["node_mask"]).shape[-1])
    mask = env.unwrapped.action_masks().reshape(N, -1)[:U, :D]  # type: ignore[attr-defined]
    return obs, enc, mask | ~mask.any(axis=1, keepdims=True)


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
