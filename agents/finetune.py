"""Fine-tuning a per-unit policy on one problem: the cross-entropy method on its chain model.

The generalist plans by chain decoding (:mod:`agents.decoding`): it reads the network's
per-unit device log-probabilities once, draws placements from a chain model with a
device-change penalty and keeps the fastest by the oracle. PPO fine-tuning
(``runners.train agent.init_policy=generalist``) rolls out the ``OneShot-v0`` action
instead, every unit sampled independently, so its first rollouts are far worse than the
zero-shot plan it starts from (``docs/generalisation.md``). :func:`chain_finetune` trains
the same network on the same chain samples that planning draws:

1. round 0 is the zero-shot plan: ``first_samples`` chain candidates (the Viterbi
   placement of each penalty of the ladder, then samples at the policy's
   :meth:`~agents.export.ExportedPolicy.decode_temperature`, as ``plan`` draws them)
   scored by the oracle;
2. the ``elite`` fastest memory-feasible distinct placements seen so far are the targets:
   ``updates`` Adam steps on their mean per-unit cross-entropy under the network (the
   cross-entropy method, Rubinstein 1999, with the network as the sampling distribution;
   self-imitation of the best plans found, Oh et al., ICML 2018);
3. each later round draws ``samples`` candidates from the updated network -- a share
   ``local`` of them as *local redraws* (one elite plan with a window of consecutive units
   redrawn from the network's chain model at a ``temperature``, conditioned on the rest of
   the plan: a large-neighbourhood search whose repair step is the policy), the rest as
   fresh chain candidates (Viterbi placements first) --, scores the ones not seen before
   (a repeated placement costs no oracle call) and updates the elite set;

until the oracle-call budget, the time budget or the ``target`` step time is reached, or
the chain model stops proposing unseen placements (``patience`` rounds in a row).
The weights change, the encoding and the decoding do not: the result carries the
fine-tuned :class:`~agents.export.ExportedPolicy`.
"""

from __future__ import annotations

import bisect
import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.schema import is_number, is_whole


@dataclass
class FinetuneResult:
    """What :func:`chain_finetune` found.

    Attributes:
        placement: node placement of the fastest memory-feasible plan (``None``: none found).
        step_time: its step time (s; ``inf`` when none).
        oracle_calls: oracle calls made, round 0 (the zero-shot plan) included.
        zero_shot_calls: the calls of round 0 alone.
        zero_shot_step_time: the best step time after round 0 (the zero-shot plan's).
        seconds: wall time of the whole call.
        rounds: rounds run after round 0.
        stop: why it stopped: ``"target"``, ``"calls"``, ``"seconds"``, ``"rounds"`` or
            ``"collapsed"`` (no unseen placement in ``patience`` rounds).
        curve: ``(round, oracle calls, seconds, best step time)`` at round 0 and at each
            improvement.
        policy: the fine-tuned policy (a copy; the caller's is unchanged).
    """

    placement: np.ndarray | None
    step_time: float
    oracle_calls: int
    zero_shot_calls: int
    zero_shot_step_time: float
    seconds: float
    rounds: int
    stop: str
    curve: list[tuple[int, int, float, float]] = field(default_factory=list)
    policy: Any = None


def chain_finetune(
    policy: Any,
    graph: CompGraph,
    cluster: Cluster,
    *,
    oracle: Any = None,
    microbatches: int = 8,
    schedule: str = "1f1b",
    calls: int = 4096,
    seconds: float | None = None,
    target: float | None = None,
    first_samples: int | None = None,
    samples: int = 64,
    elite: int = 4,
    updates: int = 8,
    lr: float = 1e-3,
    penalty: float | Sequence[float] | None = None,
    link_exponent: float | None = None,
    max_rounds: int | None = None,
    patience: int = 3,
    local: float = 1.0,
    window: int | None = None,
    temperature: float = 6.0,
    sequential: bool = False,
    moves: float = 0.0,
    focus: float = 0.0,
    screen: int = 1,
    seed: int = 0,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> FinetuneResult:
    """Fine-tune ``policy`` (a per-unit :class:`~agents.export.ExportedPolicy`, e.g.
    ``agents.load_policy("generalist")``) on ``graph`` x ``cluster`` by the cross-entropy
    method on its chain model (module docstring).

    Args:
        oracle: scores placements (default: the simulator with ``microbatches`` and
            ``schedule``); its ``evaluate`` is called once per distinct placement.
        calls: oracle-call budget, round 0 included (>= 1).
        seconds: wall-time budget (``None``: none).
        target: stop as soon as a plan this fast (s) is found.
        first_samples: round 0's candidates (default: ``policy.default_samples()``, what
            ``policy.plan`` scores, so round 0 is the zero-shot plan).
        samples: candidates per later round (>= 1). The defaults of ``samples``, ``elite``,
            ``updates`` and ``lr`` are the best of four settings on the validation draw
            (``docs/generalisation.md``).
        elite: how many of the fastest distinct plans the network imitates (>= 1).
        updates: Adam steps per round (>= 1), learning rate ``lr`` (> 0).
        penalty: the chain decoding's device-change penalty or ladder (default: the
            policy's, as in ``plan``).
        link_exponent: device changes weighted by the cluster's links, as in ``plan``
            (default: the policy's ``meta["decode_link_exponent"]``, else
            :data:`agents.decoding.DEFAULT_LINK_EXPONENT`); the same weights for round 0,
            later whole-placement draws and window redraws.
        max_rounds: stop after this many rounds after round 0.
        patience: stop after this many rounds in a row without an unseen placement.
        local: the share of each later round's ``samples`` drawn as local redraws
            (:func:`agents.decoding.resample_window`): one of the ``elite`` plans (at random)
            with a window of at most ``window`` consecutive units redrawn from the network's
            chain model, conditioned on the rest of the plan; the others are fresh chain
            candidates as in round 0. ``0``: chain candidates only (the default until 25 Nov
            2026). The defaults of ``local``, ``window`` and ``temperature`` were chosen on
            the validation draw (``docs/generalisation.md``).
        window: the longest window (default: an eighth of the units, at least 2).
        temperature: the window's log-probabilities are divided by it before drawing
            (> 1: flatter than the network, more exploration).
        sequential: draw and score a round's local redraws one at a time, each from the
            elite plans as they stand after the previous one was scored (an improvement is
            redrawn from at once); ``False``: all of a round's redraws from the elite set of
            the round's start. The network is updated between rounds either way.
        moves: the share of each later round's local draws that are annealing's moves
            (:func:`agents.baselines.anneal.propose`: shift a stage boundary, move a unit to
            a neighbour's device, swap two units, move a colocation group; memory-checked)
            of one of the ``elite`` plans instead of network redraws. ``0`` (default): the
            network proposes every draw.
        focus: the share of the network's window redraws placed on the plan's bottleneck:
            the window holds the first unit after one of the device changes into or out of
            the elite plan's busiest device (by the oracle's ``device_busy`` of that plan,
            :func:`agents.decoding.bottleneck_edges`), drawn uniformly; the others anywhere.
            ``0`` (default): anywhere.
        screen: each annealing move (``moves > 0``) is the one of ``screen`` proposals of
            the same elite plan that the network's chain model scores highest
            (:func:`agents.decoding.chain_score` of the current log-probabilities at the first
            penalty): the fine-tuned network screens the moves, and only the chosen one is
            scored by the oracle. ``1`` (default): no screening.
        seed: seeds the chain samples; the result is deterministic for a seed.
        on_round: called after every round with ``{"round", "calls", "seconds", "best",
            "new"}`` (a progress bar, a logger).

    Raises:
        ValueError: a bad budget or option, or a policy that is not per-unit.
    """
    from agents import decoding
    from agents.export import ACTION_MASK_LOGIT, chain_inputs
    from agents.policies.dense import dense_from_obs

    if policy.mode != "per_node":
        raise ValueError(
            f"chain_finetune needs a per-unit policy (mode 'per_node', as the generalist), "
            f"not mode {policy.mode!r}"
        )
    check_options(
        calls=calls, seconds=seconds, samples=samples, elite=elite, updates=updates, lr=lr,
        patience=patience, local=local, window=window, temperature=temperature, moves=moves,
        screen=screen, focus=focus, first_samples=first_samples, penalty=penalty,
        link_exponent=link_exponent, sequential=sequential,
    )  # fmt: skip
    if first_samples is None:
        first_samples = policy.default_samples()
    if penalty is None:
        penalty = policy.meta.get("decode_penalty", decoding.DEFAULT_PENALTY)
    try:  # NaN used to pass and collapse the search onto one plan after 2 calls
        pens = [decoding.check_penalty(x) for x in ([penalty] if np.isscalar(penalty) else penalty)]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"chain_finetune: {exc} (option penalty)") from None
    # device changes weighted by the links as plan() weighs them, so round 0 is its plan
    link_exponent, weights = policy.decode_link_weights(cluster, link_exponent)
    sample_temp = policy.decode_temperature()  # whole-placement draws sample as plan does
    if oracle is None:
        from placement_env.oracles.simulator import Simulator

        oracle = Simulator(graph, cluster, microbatches=microbatches, schedule=schedule)

    t0 = time.perf_counter()
    tuned = copy.copy(policy)
    tuned.net = copy.deepcopy(policy.net)
    tuned.meta = {**policy.meta}
    net = tuned.net
    torch.manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    rng = np.random.default_rng(seed)

    env = tuned.make_env(graph, cluster, oracle)
    try:
        obs, enc, allowed = chain_inputs(env, seed)
    finally:
        env.close()
    U, D = allowed.shape
    mask = torch.as_tensor(allowed)
    g = dense_from_obs({k: torch.as_tensor(np.asarray(v))[None] for k, v in obs.items()})

    def log_probs() -> torch.Tensor:
        scores, _ = net(g)
        s = scores[0, :U, :D].masked_fill(~mask, ACTION_MASK_LOGIT)
        return torch.log_softmax(s, dim=-1)

    scored: dict[bytes, float] = {}  # unit placement -> step time (inf: out of memory)
    units_of: dict[bytes, np.ndarray] = {}
    edges_of: dict[bytes, np.ndarray] = {}  # bottleneck edges of each plan (focus > 0)
    best_t, best_key = float("inf"), None
    ncalls = 0
    curve: list[tuple[int, int, float, float]] = []
    top: list[tuple[float, bytes]] = []  # the `elite` fastest feasible (step time, key), sorted

    def score(cands: list[np.ndarray], budget: int) -> int:
        nonlocal best_t, best_key, ncalls
        new = 0
        for units in cands:
            key = units.tobytes()
            if key in scored:
                continue
            if ncalls >= budget:
                break
            res = oracle.evaluate(enc.units.node_placement(units))
            ncalls += 1
            new += 1
            t = float(res.step_time)
            t = t if (not res.oom and np.isfinite(t)) else float("inf")
            scored[key], units_of[key] = t, units.copy()
            if focus > 0 and np.isfinite(t):
                edges_of[key] = decoding.bottleneck_edges(units, np.asarray(res.device_busy))
            if t < best_t:
                best_t, best_key = t, key
            if np.isfinite(t) and (len(top) < elite or (t, key) < top[-1]):
                bisect.insort(top, (t, key))
                del top[elite:]
        return new

    win = int(window) if window is not None else max(2, U // 8)

    def masked_log_probs() -> np.ndarray:
        """The network's per-unit log-probabilities now, forbidden devices at ``-inf``."""
        with torch.no_grad():
            return np.where(allowed, log_probs().double().numpy(), -np.inf)

    def draw(lp: np.ndarray, k: int) -> list[np.ndarray]:
        if k <= 0:
            return []
        return decoding.candidates(
            lp, pens, k, greedy=True, rng=rng, temperature=sample_temp, weights=weights
        )

    def draw_local(lp: np.ndarray, k: int) -> list[np.ndarray]:
        """``k`` window redraws (:func:`agents.decoding.resample_window`) of elite plans."""
        if not top or k <= 0:
            return []
        keys = [key for _, key in top]
        out = []
        for _ in range(k):
            key = keys[int(rng.integers(len(keys)))]
            pen = pens[int(rng.integers(len(pens)))]
            around = None
            if focus > 0 and rng.random() < focus:
                edges = edges_of.get(key)
                if edges is not None and len(edges):
                    around = int(edges[int(rng.integers(len(edges)))])
            out.append(
                decoding.resample_window(
                    lp,
                    units_of[key],
                    pen,
                    rng,
                    window=win,
                    temperature=temperature,
                    around=around,
                    weights=weights,
                )[0]
            )
        return out

    prob = nbrs = None
    if moves > 0:
        from agents.baselines.anneal import propose, unit_neighbours
        from agents.baselines.common import make_problem

        prob = make_problem(graph, cluster, oracle)
        nbrs = unit_neighbours(prob)
        # the baselines number units by colocation group id; the encoding by topological
        # rank: encoding unit u is the baselines' unit prob.order[u] (both sort the groups
        # by their first topological position, stably)
        if len(prob.order) != U:
            raise ValueError("chain_finetune: the encoding's units differ from the baselines'")

    def draw_move(k: int, lp: np.ndarray) -> list[np.ndarray]:
        """``k`` annealing moves (:func:`~agents.baselines.anneal.propose`) of elite plans,
        each the best of ``screen`` proposals by the chain score under ``lp`` (the first of
        ties)."""
        if not top or k <= 0:
            return []
        out = []
        for _ in range(k):
            base = units_of[top[int(rng.integers(len(top)))][1]]
            up = np.empty(U, dtype=np.int64)
            up[prob.order] = base
            use = prob.memory_use(up)
            steps = [propose(prob, up, use, rng, nbrs) for _ in range(int(screen))]
            cands = [step[0][prob.order] for step in steps if step is not None]
            if cands:
                out.append(
                    cands[0]
                    if screen == 1
                    else max(cands, key=lambda c: decoding.chain_score(lp, c, pens[0], weights))
                )
        return out

    def draw_near(lp: np.ndarray, k: int) -> list[np.ndarray]:
        """``k`` local draws: each an annealing move with probability ``moves``, else a
        network window redraw."""
        if k <= 0:
            return []
        n_mv = int(rng.binomial(k, moves)) if moves > 0 else 0
        return draw_move(n_mv, lp) + draw_local(lp, k - n_mv)

    def elapsed() -> float:
        return time.perf_counter() - t0

    score(draw(masked_log_probs(), int(first_samples)), int(calls))
    zs_calls, zs_best = ncalls, best_t
    curve.append((0, ncalls, elapsed(), best_t))
    if on_round is not None:
        on_round({"round": 0, "calls": ncalls, "seconds": elapsed(), "best": best_t, "new": ncalls})
    rounds, idle, stop = 0, 0, "calls"
    while True:
        if target is not None and best_t <= target:
            stop = "target"
            break
        if ncalls >= calls:
            stop = "calls"
            break
        if seconds is not None and elapsed() >= seconds:
            stop = "seconds"
            break
        if max_rounds is not None and rounds >= max_rounds:
            stop = "rounds"
            break
        if not top:  # nothing to imitate: draw again from the unchanged network
            tgt = None
        else:
            tgt = torch.as_tensor(np.stack([units_of[k] for _, k in top]), dtype=torch.long)
        if tgt is not None:
            for _ in range(updates):
                lp = log_probs()
                nll = -lp.gather(1, tgt.T).mean()  # mean over units and elites
                opt.zero_grad()
                nll.backward()
                opt.step()
        rounds += 1
        before = best_t
        lp = masked_log_probs()  # one forward pass per round
        n_local = int(round(local * samples))
        if sequential:
            new = 0
            for _ in range(n_local):
                if ncalls >= calls or (target is not None and best_t <= target):
                    break
                new += score(draw_near(lp, 1), int(calls))
            new += score(draw(lp, samples - n_local), int(calls))
        else:
            cands = draw_near(lp, n_local)
            cands += draw(lp, samples - len(cands))
            new = score(cands, int(calls))
        if best_t < before:
            curve.append((rounds, ncalls, elapsed(), best_t))
        if on_round is not None:
            on_round(
                {"round": rounds, "calls": ncalls, "seconds": elapsed(), "best": best_t, "new": new}
            )
        idle = idle + 1 if new == 0 else 0
        if idle >= patience:
            stop = "collapsed"
            break
    net.eval()
    placement = None
    if best_key is not None:
        placement = np.asarray(enc.units.node_placement(units_of[best_key]), dtype=np.int64)
    # the fine-tuned network plans with the device-change weights it was fine-tuned with
    tuned.meta["decode_link_exponent"] = link_exponent
    tuned.meta["finetune"] = {
        "method": "chain cross-entropy",
        "calls": ncalls,
        "rounds": rounds,
        "samples": int(samples),
        "first_samples": int(first_samples),
        "elite": int(elite),
        "updates": int(updates),
        "lr": float(lr),
        "local": float(local),
        "window": int(win),
        "temperature": float(temperature),
        "sample_temperature": float(sample_temp),
        "link_exponent": link_exponent,
        "sequential": bool(sequential),
        "moves": float(moves),
        "focus": float(focus),
        "screen": int(screen),
        "seed": int(seed),
    }
    return FinetuneResult(
        placement=placement,
        step_time=best_t,
        oracle_calls=ncalls,
        zero_shot_calls=zs_calls,
        zero_shot_step_time=zs_best,
        seconds=elapsed(),
        rounds=rounds,
        stop=stop,
        curve=curve,
        policy=tuned,
    )


__all__ = ["OPTIONS", "FinetuneResult", "chain_finetune", "check_options"]


#: The keyword options of :func:`chain_finetune` that :func:`check_options` checks (its budget
#: ``calls`` and ``seconds`` and the search's settings; ``runners.train.FINETUNE_OPTIONS`` are
#: these less the budget, as ``agent.options``).
OPTIONS = (
    "calls", "seconds", "first_samples", "samples", "elite", "updates", "lr", "penalty",
    "link_exponent", "patience", "local", "window", "temperature", "sequential", "moves",
    "focus", "screen",
)  # fmt: skip


def check_options(**options: Any) -> None:
    """``ValueError`` naming the first bad one of :func:`chain_finetune`'s budget and
    options given as keywords (the others take their defaults), as ``chain_finetune``
    raises it: for callers that want a bad option refused before they spend time (the
    runners check ``agent.options`` before the env's baselines run). Unknown names raise
    too."""
    import inspect

    from agents import decoding

    bad = sorted(set(options) - set(OPTIONS))
    if bad:
        raise ValueError(
            f"chain_finetune: unknown option(s) {bad}; expected some of {sorted(OPTIONS)}"
        )
    sig = inspect.signature(chain_finetune).parameters
    o = {k: sig[k].default for k in OPTIONS} | options
    # whole numbers and finite rates (1.5 samples used to be cut to 1, "abc" to fail in int(),
    # lr="abc" with a TypeError, lr=inf to be taken)
    for name in ("calls", "samples", "elite", "updates", "patience", "screen"):
        if not is_whole(o[name], 1):
            raise ValueError(f"chain_finetune: {name} must be an integer >= 1, got {o[name]!r}")
    if o["first_samples"] is not None and not is_whole(o["first_samples"], 1):  # None: default
        raise ValueError(
            f"chain_finetune: first_samples must be an integer >= 1, got {o['first_samples']!r}"
        )
    if o["window"] is not None and not is_whole(o["window"], 1):
        raise ValueError(f"chain_finetune: window must be >= 1 (an integer), got {o['window']!r}")
    if not is_number(o["lr"], 0, lo_open=True):
        raise ValueError(f"chain_finetune: lr must be a finite number > 0, got {o['lr']!r}")
    for name in ("local", "moves", "focus"):
        if not is_number(o[name]) or not 0.0 <= o[name] <= 1.0:
            raise ValueError(f"chain_finetune: {name} must be in [0, 1], got {o[name]!r}")
    t = o["temperature"]
    if not is_number(t):
        raise ValueError(f"chain_finetune: temperature must be a finite number > 0, got {t!r}")
    if not t > 0:
        raise ValueError(f"chain_finetune: temperature must be > 0, got {t}")
    if o["seconds"] is not None and not is_number(o["seconds"], 0, lo_open=True):
        raise ValueError(f"chain_finetune: seconds must be > 0 (finite), got {o['seconds']!r}")
    if o["penalty"] is not None:
        pen = o["penalty"]
        try:
            for x in [pen] if np.isscalar(pen) else pen:
                decoding.check_penalty(x)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"chain_finetune: {exc} (option penalty)") from None
    le = o["link_exponent"]
    if le is not None and not is_number(le, 0.0):
        raise ValueError(f"chain_finetune: link_exponent must be a number >= 0, got {le!r}")
    if not isinstance(o["sequential"], (bool, np.bool_)):
        raise ValueError(
            f"chain_finetune: sequential must be True or False, got {o['sequential']!r}"
        )
