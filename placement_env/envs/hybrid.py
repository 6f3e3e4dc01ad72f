"""Hybrid-v0: plan a dp x tp x pp layout (ZeRO, recomputation, schedule, stage boundaries) of a transformer step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import (
    RECOMPUTE,
    ZERO_STAGES,
    HybridLayout,
    layout_grid,
    model_dims,
    submesh_tps,
    with_stage_recompute,
    with_stage_tp,
    with_stage_zero,
)
from graphs.plan import hybrid_placement
from graphs.schema import is_number, is_whole
from placement_env.envs.base import MAX_OVERFLOW, MAX_TIME_RATIO, as_int_action
from placement_env.types import Instance

#: Layout fields an action changes (one step down or up among the valid layouts that keep
#: every other field; ``dp`` follows from ``tp`` and ``pp``).
KEYS = ("tp", "pp", "microbatch_size", "virtual_stages", "recompute", "sequence_parallel", "zero")
LAYOUT_FEATURES = 16
PROBLEM_FEATURES = 8
RESULT_FEATURES = 4
CHUNK_FEATURES = 6  # and a 7th, the stage's ZeRO stage, with ``stage_zero=True``
ZERO_MAX = max(ZERO_STAGES)
INITS = ("megatron", "random")


def _order(key: str, value: Any) -> float:
    return float(RECOMPUTE.index(value)) if key == "recompute" else float(value)


class _FixedHybrid:
    """Default instances: a small GPT (8 layers, h = 1024) on two DGX A100 nodes."""

    def __init__(self) -> None:
        self._inst: Instance | None = None

    def sample(self, rng: np.random.Generator) -> Instance:
        if self._inst is None:
            from graphs import clusters, zoo

            g = zoo.build("gpt", hidden=1024, layers=8, heads=16, vocab=51200, seq=1024, batch=32)
            self._inst = Instance(g, clusters.load("dgx_a100_80g", nodes=2), "gpt-1b/a100x16")
        return self._inst


class HybridEnv(gym.Env[dict, Any]):
    """Hybrid-parallel planning of a layered transformer on a GPU cluster.

    The state is a :class:`graphs.layout.HybridLayout`; every step changes one field of it
    or moves one stage boundary, and the oracle (the simulator's hybrid step model,
    ``oracle.evaluate_layout``) scores the result. The space of fields is
    :func:`graphs.layout.layout_grid` of the instance (``t`` within a node, every
    ``p``, microbatch sizes 1-8, ``v``, recomputation, SP, ZeRO 0-3).

    ## Action Space

    ``Discrete(2 * 7 + 2 * (max_chunks - 1) + 2 * max_chunks + 2 * max_chunks)``, and
    ``2 * max_chunks`` more with ``stage_zero=True``:

    - ``a < 14``: field ``KEYS[a // 2]`` (``tp``, ``pp``, ``microbatch_size``,
      ``virtual_stages``, ``recompute``, ``sequence_parallel``, ``zero``) one step down
      (``a`` even) or up (``a`` odd) to the nearest valid layout that keeps the other
      fields (``dp = D / (tp pp)``). Stage boundaries are kept when the chunk count does
      not change, else reset to an even split.
    - ``14 <= a < 14 + 2 (max_chunks - 1)``: with ``b = (a - 14) // 2``, move the end of
      chunk ``b`` (the start of chunk ``b + 1``) one layer left (even) or right (odd).
    - the next ``2 * max_chunks``: with ``q`` the offset into them, pipeline stage
      ``q // 2``'s tensor-parallel degree one step down (even) or up (odd) on its own
      submesh (its GPU count kept, ``dp`` following; ``v = 1`` layouts only): the next
      ``tp`` that divides the submesh and the heads, fits a node, and leaves a ``dp`` that
      divides the microbatch of ``dp * microbatch_size`` samples. The layout then has
      ``stage_meshes`` (:class:`graphs.layout.HybridLayout`), or none again when every
      stage is back on the same shape; a field move (the first 14) lands on a layout of the
      grid, whose stages share one shape.
    - the last ``2 * max_chunks``: pipeline stage ``q // 2``'s recomputation one step down
      (even: less, ``full`` -> ``selective`` -> ``none``) or up (odd) (``v = 1`` layouts
      only): the layout then has ``stage_recompute``, or none again when every stage is
      back on one mode (:func:`graphs.layout.with_stage_recompute`).
    - with ``stage_zero=True``, the last ``2 * max_chunks``: pipeline stage ``q // 2``'s
      ZeRO stage one down (even) or up (odd) (``v = 1`` layouts only; up only where the
      stage has ``dp > 1``, as the grid): the layout then has ``stage_zero``, or none again
      when every stage is back on one ZeRO stage (:func:`graphs.layout.with_stage_zero`).

    A move with no valid target (no such layout, an empty chunk, a chunk beyond the
    layout's ``pp * v``) is a no-op flagged ``info["invalid_action"]``; ``action_masks()``
    masks exactly these. A non-integer or out-of-range action raises ``ValueError``.

    ## Observation Space

    ``spaces.Dict`` of float32 ``Box``es:

    | key | shape | meaning |
    | --- | --- | --- |
    | ``layout`` | ``(16,)`` | log2 of dp, tp, pp, microbatch, v, microbatches (scaled); recompute one-hot (3); SP; ZeRO one-hot (4); ``num_chunks / max_chunks`` |
    | ``problem`` | ``(8,)`` | log10 parameters / 12, log2 GPUs / 13, layers / 128, heads / 128, log2 hidden / 15, log2 seq / 14, GPU memory (GB) / 100, GPU peak (PFLOP/s) |
    | ``result`` | ``(4,)`` | step time / lower bound (clipped at 1e3) / 10, OOM, peak memory / capacity (clipped at 11), MFU |
    | ``chunks`` | ``(max_chunks * 6,)`` | per chunk (row-major, 6 each): its layers / all layers, its start / layers, its pipeline rank / pp, log2 of its stage's tp / 3 and dp / log2 GPUs, its stage's recomputation (none 0, selective 0.5, full 1); with ``stage_zero=True`` 7 each, the 7th its stage's ZeRO stage / 3 |
    | ``chunk_mask`` | ``(max_chunks,)`` | 1 for the layout's chunks, 0 for padding |

    ## Rewards

    ``r_t = cost(l_{t-1}) - cost(l_t)`` (positive when the step gets faster),
    ``cost = min(step_time / lower_bound, 1e3) + oom * oom_penalty * (1 + overflow)``,
    ``overflow = min(peak / capacity - 1, 10)``; the lower bound is the model FLOPs at the
    GPUs' peak. No-op steps give 0.

    ## Episode End

    - Termination: never.
    - Truncation: ``max_episode_steps`` of the registration (64).

    ## Arguments

    - ``generator``: yields :class:`placement_env.types.Instance` s of layered transformer
      graphs (default: a 1B-parameter GPT on 16 A100s).
    - ``oracle_factory``: ``(graph, cluster) -> Simulator`` (default ``Simulator``).
    - ``global_batch``: samples per step (default: the graph's batch).
    - ``max_chunks``: padding of the ``chunks`` table (default 128; larger layouts are
      left out of the space).
    - ``init``: ``"megatron"`` (largest ``tp`` in a node, fewest stages, microbatch 1,
      full recomputation, ZeRO-0) or ``"random"`` (a random layout of the space).
    - ``oom_penalty``: as the other envs (default 1).
    - ``stage_zero``: add the per-stage ZeRO moves and the chunks' ZeRO column (default
      ``False``: the action and observation spaces of the env before this option).

    ## Info

    ``placement`` (int64 ``(n,)``: each node on the first GPU of its stage, as
    :meth:`graphs.plan.Plan.hybrid`), ``step_time``, ``oom``, ``best_step_time``, ``layout``
    (its dict), ``oracle_calls``, ``invalid_action``.

    ## Version History

    - v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        generator: Any = None,
        oracle_factory: Callable[[CompGraph, Cluster], Any] | None = None,
        *,
        global_batch: int | None = None,
        max_chunks: int = 128,
        init: str = "megatron",
        oom_penalty: float = 1.0,
        stage_zero: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if init not in INITS:
            raise ValueError(f"HybridEnv: init {init!r} is unknown; expected one of {INITS}")
        if global_batch is not None and not is_whole(global_batch, 1):  # 0 used to mean the default
            raise ValueError(
                f"HybridEnv: global_batch {global_batch!r}: expected an integer >= 1 (None: the "
                "model's batch)"
            )
        if not is_whole(max_chunks, 1):  # 0 used to end in "no valid layout"
            raise ValueError(f"HybridEnv: max_chunks {max_chunks!r}: expected an integer >= 1")
        if not is_number(oom_penalty, 0):  # a negative one rewarded OOM
            raise ValueError(
                f"HybridEnv: oom_penalty {oom_penalty!r}: expected a finite number >= 0"
            )
        if not isinstance(stage_zero, (bool, np.bool_)):  # "false" from a YAML string is truthy
            raise ValueError(f"HybridEnv: stage_zero {stage_zero!r}: expected true or false")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported")
        from placement_env.generators import check_generator_object

        check_generator_object(generator, oracle_factory, "HybridEnv", needs=("sample",))
        self.generator = generator if generator is not None else _FixedHybrid()
        self.oracle_factory = oracle_factory
        self.global_batch = global_batch
        self.max_chunks = int(max_chunks)
        self.init = init
        self.oom_penalty = float(oom_penalty)
        self.stage_zero = bool(stage_zero)
        self.chunk_features = CHUNK_FEATURES + int(self.stage_zero)
        self.render_mode = render_mode
        K = self.max_chunks
        f32 = np.float32
        self.observation_space = spaces.Dict(
            {
                "layout": spaces.Box(0.0, 1.0, (LAYOUT_FEATURES,), f32),
                "problem": spaces.Box(0.0, 16.0, (PROBLEM_FEATURES,), f32),
                "result": spaces.Box(0.0, MAX_TIME_RATIO / 10, (RESULT_FEATURES,), f32),
                "chunks": spaces.Box(0.0, 1.0, (K * self.chunk_features,), f32),
                "chunk_mask": spaces.Box(0.0, 1.0, (K,), f32),
            }
        )
        self.action_space = spaces.Discrete(
            2 * len(KEYS) + 2 * (K - 1) + (6 if stage_zero else 4) * K
        )
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._prep: dict[str, Any] | None = None
        self.layout: HybridLayout | None = None
        self.total_oracle_calls = 0
        self.best_step_time = float("inf")
        self._res: Any = None
        self._cost = 0.0
        self._invalid = False

    # ------------------------------------------------------------ instances
    def _prepare(self, inst: Instance) -> dict[str, Any]:
        from placement_env.oracles import Simulator

        g, cl = inst.graph, inst.cluster
        oracle = (self.oracle_factory or Simulator)(g, cl)
        d = model_dims(g)
        gb = int(self.global_batch if self.global_batch is not None else d.batch)
        space = [
            lay for lay in layout_grid(g, cl, global_batch=gb) if lay.num_chunks <= self.max_chunks
        ]
        if not space:
            raise ValueError(f"HybridEnv: no valid layout of {inst.name or g.meta.get('name')!r}")
        # on a hybrid-calibrated cpu_N only the calibrated (tp, microbatch, recompute) layouts
        # can be scored: the others are not states (and moves to them are masked)
        model = oracle.hybrid_model() if hasattr(oracle, "hybrid_model") else None
        unscorable = getattr(model, "missing", None)  # None: every layout can be scored
        if unscorable is not None:
            why = unscorable(space[0])
            space = [lay for lay in space if unscorable(lay) is None]
            if not space:
                raise ValueError(
                    f"HybridEnv: the oracle can score no layout of "
                    f"{inst.name or g.meta.get('name')!r} on {cl.name!r}; the first lacks: {why}"
                )
        index: dict[tuple, list[int]] = {}
        for i, lay in enumerate(space):
            for k in KEYS:
                index.setdefault((k, self._sig(lay, k)), []).append(i)
        for k_sig, lst in index.items():
            lst.sort(key=lambda i, k=k_sig[0]: _order(k, getattr(space[i], k)))
        dev = cl.devices[0]
        lb = d.model_flops(gb) / cl.num_devices / dev.peak_flops
        problem = np.array(
            [
                np.log10(d.num_params()) / 12, np.log2(cl.num_devices) / 13, d.layers / 128,
                d.heads / 128, np.log2(d.hidden) / 15, np.log2(d.seq) / 14,
                dev.memory / 1e11, dev.peak_flops / 1e15,
            ],
            dtype=np.float32,
        )  # fmt: skip
        max_tp = int(cl.meta.get("gpus_per_node", min(cl.num_devices, 8)))
        return dict(
            graph=g, oracle=oracle, space=space, index=index, lb=lb, problem=problem, dims=d,
            capacity=float(dev.memory), devices=cl.num_devices, gb=gb, max_tp=max_tp,
            stage_tps={}, unscorable=unscorable,
        )  # fmt: skip

    @staticmethod
    def _sig(lay: HybridLayout, key: str) -> tuple:
        return tuple(getattr(lay, k) for k in KEYS if k != key)

    # ------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        inst = self.generator.sample(self.np_random)
        key = inst.key
        if key not in self._cache:
            self._cache[key] = self._prepare(inst)
        self._prep = self._cache[key]
        space = self._prep["space"]
        if self.init == "random":
            lay = space[int(self.np_random.integers(0, len(space)))]
        else:
            lay = min(
                space,
                key=lambda x: (-x.tp, x.pp, x.microbatch_size, x.virtual_stages,
                               x.recompute != "full", x.sequence_parallel, x.zero),
            )  # fmt: skip
        self.best_step_time = float("inf")
        self._episode_calls = 0
        self._invalid = False
        self._set(lay)
        return self._get_obs(), self._get_info()

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self._prep is None or self.layout is None:
            raise RuntimeError("HybridEnv: call reset() before step()")
        a = as_int_action(action, int(self.action_space.n))
        new = self._target(a)
        self._invalid = new is None
        reward = 0.0
        if new is not None:
            before = self._cost
            self._set(new)
            reward = before - self._cost
        return self._get_obs(), float(reward), False, False, self._get_info()

    def action_masks(self) -> np.ndarray:
        """``bool[n]``: the actions that change the layout (see the class docstring)."""
        lay = self.layout
        assert lay is not None
        nk = 2 * len(KEYS)
        mask = np.zeros(int(self.action_space.n), dtype=bool)
        mask[:nk] = [self._target(a) is not None for a in range(nk)]
        for b in range(lay.num_chunks - 1):  # boundary moves: no layout needs building
            (a0, a1), (_, b1) = lay.stage_layers[b], lay.stage_layers[b + 1]
            mask[nk + 2 * b] = a1 - 1 > a0
            mask[nk + 2 * b + 1] = a1 + 1 < b1
        ns = nk + 2 * (self.max_chunks - 1)
        # one stage's tp, recomputation or ZeRO stage; where the oracle can refuse a layout
        # (an uncalibrated shape) the layout is built and checked, else only its value
        nr = ns + 2 * self.max_chunks
        nz = nr + 2 * self.max_chunks
        build = self._prep["unscorable"] is not None
        for start, nxt in ((ns, self._stage_tp_next), (nr, self._stage_rc_next),
                           (nz, self._stage_zero_next)):  # fmt: skip
            for a in range(start, min(start + 2 * lay.pp, len(mask))):
                if build:
                    mask[a] = self._target(a) is not None
                else:
                    mask[a] = nxt(lay, (a - start) // 2, (a - start) % 2 == 1) is not None
        return mask

    def render(self) -> str | None:
        if self.render_mode == "ansi" and self.layout is not None:
            return f"{self.layout}  step {self._res.step_time:.4g} s  oom {self._res.oom}"
        return None

    # ------------------------------------------------------------ internals
    def _set(self, lay: HybridLayout) -> None:
        p = self._prep
        assert p is not None
        self.layout = lay
        self._res = p["oracle"].evaluate_layout(lay)
        self._episode_calls += 1
        self.total_oracle_calls += 1
        r = self._res
        ratio = min(float(r.step_time) / p["lb"], MAX_TIME_RATIO)
        over = float(np.max(r.peak_memory)) / p["capacity"] - 1.0
        self._cost = ratio + (
            self.oom_penalty * (1.0 + min(max(over, 0.0), MAX_OVERFLOW)) if r.oom else 0.0
        )
        if not r.oom:
            self.best_step_time = min(self.best_step_time, float(r.step_time))

    def _target(self, a: int) -> HybridLayout | None:
        """The layout action ``a`` leads to; None for no change or one the oracle cannot
        score (``Simulator.layout_unscorable``)."""
        new = self._target_layout(a)
        check = self._prep["unscorable"] if self._prep is not None else None
        if new is None or (check is not None and check(new) is not None):
            return None
        return new

    def _target_layout(self, a: int) -> HybridLayout | None:
        lay, p = self.layout, self._prep
        assert lay is not None and p is not None
        nk = 2 * len(KEYS)
        if a < nk:
            key, up = KEYS[a // 2], a % 2 == 1
            lst = p["index"].get((key, self._sig(lay, key)), [])
            cur = _order(key, getattr(lay, key))
            vals = [i for i in lst if (_order(key, getattr(p["space"][i], key)) > cur) == up
                    and _order(key, getattr(p["space"][i], key)) != cur]  # fmt: skip
            if not vals:
                return None
            new = p["space"][vals[0] if up else vals[-1]]
            if new.num_chunks == lay.num_chunks and new.stage_layers != lay.stage_layers:
                d = new.to_dict()
                d["stage_layers"] = [list(r) for r in lay.stage_layers]
                try:
                    return HybridLayout.from_dict(d)
                except ValueError:
                    return new
            return new
        ns = nk + 2 * (self.max_chunks - 1)
        nr = ns + 2 * self.max_chunks
        nz = nr + 2 * self.max_chunks
        if a >= nz:
            stage, up = (a - nz) // 2, (a - nz) % 2 == 1
            z = self._stage_zero_next(lay, stage, up)
            return None if z is None else with_stage_zero(lay, stage, z)
        if a >= nr:
            stage, up = (a - nr) // 2, (a - nr) % 2 == 1
            mode = self._stage_rc_next(lay, stage, up)
            return None if mode is None else with_stage_recompute(lay, stage, mode)
        if a >= ns:
            return self._stage_tp_move(lay, (a - ns) // 2, (a - ns) % 2 == 1)
        b, right = (a - nk) // 2, (a - nk) % 2 == 1
        if b + 1 >= lay.num_chunks:
            return None
        stages = [list(r) for r in lay.stage_layers]
        nb = stages[b][1] + (1 if right else -1)
        if not (stages[b][0] < nb < stages[b + 1][1]):
            return None
        stages[b][1] = stages[b + 1][0] = nb
        d = lay.to_dict()
        d["stage_layers"] = stages
        return HybridLayout.from_dict(d)

    def _stage_tp_next(self, lay: HybridLayout, stage: int, up: bool) -> int | None:
        """The next valid ``tp`` of stage ``stage`` on its own submesh (``None``: none)."""
        p = self._prep
        assert p is not None
        if stage >= lay.pp or lay.virtual_stages != 1:
            return None
        dp0, tp0 = lay.meshes[stage]
        key = (dp0 * tp0, lay.dp * lay.microbatch_size)
        tps = p["stage_tps"].get(key)
        if tps is None:
            d = p["dims"]
            tps = submesh_tps(*key, heads=d.heads, kv_heads=d.kv_heads, max_tp=p["max_tp"])
            p["stage_tps"][key] = tps
        nxt = [t for t in tps if (t > tp0 if up else t < tp0)]
        if not nxt:
            return None
        return min(nxt) if up else max(nxt)

    @staticmethod
    def _stage_rc_next(lay: HybridLayout, stage: int, up: bool) -> str | None:
        """Stage ``stage``'s recomputation one step up (more) or down (``None``: none)."""
        if stage >= lay.pp or lay.virtual_stages != 1:
            return None
        i = RECOMPUTE.index(lay.recomputes[stage]) + (1 if up else -1)
        return RECOMPUTE[i] if 0 <= i < len(RECOMPUTE) else None

    @staticmethod
    def _stage_zero_next(lay: HybridLayout, stage: int, up: bool) -> int | None:
        """Stage ``stage``'s ZeRO stage one up or down (``None``: none; up needs the stage's
        ``dp > 1``, as :func:`graphs.layout.layout_grid` has ZeRO only with data parallelism)."""
        if stage >= lay.pp or lay.virtual_stages != 1:
            return None
        z = lay.zeros[stage] + (1 if up else -1)
        if up and lay.meshes[stage][0] == 1:
            return None
        return z if 0 <= z <= ZERO_MAX else None

    def _stage_tp_move(self, lay: HybridLayout, stage: int, up: bool) -> HybridLayout | None:
        """``lay`` with stage ``stage``'s ``tp`` one valid step down or up on its own submesh."""
        t = self._stage_tp_next(lay, stage, up)
        return None if t is None else with_stage_tp(lay, stage, t)

    def _get_obs(self) -> dict[str, np.ndarray]:
        lay, p, r = self.layout, self._prep, self._res
        assert lay is not None and p is not None
        D, L, K = p["devices"], p["dims"].layers, self.max_chunks
        lg = np.log2
        feat = np.zeros(LAYOUT_FEATURES, np.float32)
        feat[0] = lg(lay.dp) / max(lg(D), 1)
        feat[1] = lg(lay.tp) / 3
        feat[2] = lg(lay.pp) / max(lg(L), 1)
        feat[3] = lg(lay.microbatch_size) / 3
        feat[4] = lg(lay.virtual_stages) / 3
        feat[5] = lg(lay.num_microbatches) / max(lg(p["gb"]), 1)
        feat[6 + RECOMPUTE.index(lay.recompute)] = 1.0
        feat[9] = float(lay.sequence_parallel)
        feat[10 + lay.zero] = 1.0
        feat[14] = lay.num_chunks / K
        feat = np.clip(feat, 0.0, 1.0)
        chunks = np.zeros((K, self.chunk_features), np.float32)
        mask = np.zeros(K, np.float32)
        meshes, recs, zeros = lay.meshes, lay.recomputes, lay.zeros
        for c, (a, b) in enumerate(lay.stage_layers):
            dp_c, tp_c = meshes[c % lay.pp]
            row = (
                (b - a) / L,
                a / L,
                (c % lay.pp) / lay.pp,
                min(lg(tp_c) / 3, 1.0),
                lg(dp_c) / max(lg(D), 1),
                RECOMPUTE.index(recs[c % lay.pp]) / (len(RECOMPUTE) - 1),
            )
            chunks[c] = row + (zeros[c % lay.pp] / ZERO_MAX,) if self.stage_zero else row
            mask[c] = 1.0
        res = np.array(
            [
                min(float(r.step_time) / p["lb"], MAX_TIME_RATIO) / 10,
                float(r.oom),
                min(float(np.max(r.peak_memory)) / p["capacity"], 1.0 + MAX_OVERFLOW),
                min(float(r.mfu), 1.0),
            ],
            dtype=np.float32,
        )
        return {
            "layout": feat,
            "problem": np.clip(p["problem"], 0.0, 16.0),
            "result": res,
            "chunks": chunks.reshape(-1),
            "chunk_mask": mask,
        }

    def _get_info(self) -> dict[str, Any]:
        assert self.layout is not None
        return {
            "placement": hybrid_placement(self._prep["graph"], self.layout),
            "step_time": float(self._res.step_time),
            "oom": bool(self._res.oom),
            "best_step_time": self.best_step_time,
            "layout": self.layout.to_dict(),
            "oracle_calls": self._episode_calls,
            "invalid_action": self._invalid,
        }


__all__ = ["KEYS", "HybridEnv"]
