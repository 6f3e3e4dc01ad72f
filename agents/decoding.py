"""Chain decoding of per-unit device distributions (the generalist's ``OneShot-v0`` scores).

A per-unit policy (GDP on ``OneShot-v0``) gives every colocation unit its own categorical
over devices. Units are numbered in topological order (``placement_env.encoding.unit_graph``),
so a pipeline split is a placement that changes device rarely along that order. Sampling each
unit independently almost never produces one: a 128-unit graph gets dozens of device changes,
each a cross-device transfer. Chain decoding reads the same distributions as a chain model
with a **contiguity prior**::

    log P(d_1 .. d_U) = sum_u logp[u, d_u] - penalty * #{u > 1 : d_u != d_{u-1}} - log Z

- :func:`viterbi`: its most likely placement, exactly (dynamic programming over the chain);
- :func:`sample_chain`: exact samples from it (forward filtering, backward sampling with
  the Gumbel-max trick);
- :func:`resample_window`: a placement that redraws one window of consecutive units of a
  given placement from the chain model conditioned on the rest of it (local search with the
  policy as the proposal, used by :func:`agents.finetune.chain_finetune`);
- ``penalty = 0`` gives back independent units: Viterbi is the per-unit argmax and the
  samples are per-unit samples.

Forbidden (unit, device) pairs (the env's action mask) have probability 0 and are never
chosen. Everything is ``O(U * D^2)`` in numpy: about a millisecond for 300 units on 16 devices.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Device-change penalties (nats) of :meth:`agents.export.ExportedPolicy.plan`'s chain decoding
#: when neither the call nor the policy file's ``meta["decode_penalty"]`` gives one: a ladder
#: (:func:`candidates`: the Viterbi placement of each, then samples shared out over them).
#: Chosen on the validation draw (corpus seed 1) of ``scripts/validate_generalist.py`` against
#: single penalties 0, 1, 2, 4 and the ladders 0.5-16 and 2-16, see ``docs/generalisation.md``.
DEFAULT_PENALTY: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)

#: Sampling temperature of :meth:`agents.export.ExportedPolicy.plan`'s chain samples when
#: neither the call nor the file's ``meta["decode_temperature"]`` gives one: the samples are
#: drawn from the chain model of ``logp / temperature`` (flatter unit distributions, the same
#: device-change penalty); the Viterbi placements are not affected. 1: the network's own
#: distributions. T = 3 was best on the validation draw (1.083 against 1.114) but worse on
#: the held-out pairs (1.137 against 1.111, worst 1.29 against 1.21), so the default stays 1
#: (26 Nov 2026, ``docs/generalisation.md``).
DEFAULT_TEMPERATURE: float = 1.0

#: Link exponent of :meth:`agents.export.ExportedPolicy.plan`'s chain decoding when neither the
#: call nor the file's ``meta["decode_link_exponent"]`` gives one: a device change ``a -> b``
#: costs the penalty times ``(best bandwidth / bandwidth(a, b)) ** exponent``
#: (:func:`link_weights`); clusters whose routes all have one bottleneck bandwidth decode as
#: with 0 (every change the same, the decoding before 29 Nov 2026). 1 since 29 Nov 2026, by a
#: protocol written before its run: neutral on the validation draw (1.1414 against 1.1406),
#: 1.171 against 1.290 on the fresh Ethernet clusters of ``generalist.LINK_CHECK_CORPUS``
#: (``docs/generalisation.md``, "Link-aware device changes").
DEFAULT_LINK_EXPONENT: float = 1.0


def masked_log_probs(logits: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per-unit log-softmax of ``logits`` ``(U, D)``; masked-out entries get ``-inf``.

    A unit whose mask forbids every device keeps all of them (as the env's mask never does).
    """
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"logits must be (units, devices), got shape {x.shape}")
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        if m.shape != x.shape:
            raise ValueError(f"mask shape {m.shape} != logits shape {x.shape}")
        m = m | ~m.any(axis=1, keepdims=True)
        x = np.where(m, x, -np.inf)
    mx = x.max(axis=1, keepdims=True)
    lse = mx + np.log(np.exp(x - mx).sum(axis=1, keepdims=True))
    return x - lse


def _transition(D: int, penalty: float, weights: np.ndarray | None = None) -> np.ndarray:
    if weights is None:
        t = np.full((D, D), -float(penalty))
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (D, D) or not np.all(np.isfinite(w[~np.eye(D, dtype=bool)])) or (w < 0).any():
            raise ValueError(
                f"link weights must be a ({D}, {D}) matrix of finite numbers >= 0, got shape {w.shape}"
            )
        t = -float(penalty) * w
    np.fill_diagonal(t, 0.0)
    return t


def link_weights(cluster: Any, exponent: float) -> np.ndarray:
    """``(D, D)`` relative cost of a device change ``a -> b`` for link-aware chain decoding:
    ``(best bandwidth / bandwidth(a, b)) ** exponent`` over the cluster's routes (the slowest
    link of each route), 1 on the best routes; ``exponent`` 0 gives the uniform penalty."""
    e = float(exponent)
    if not (np.isfinite(e) and e >= 0):
        raise ValueError(f"link exponent must be a finite number >= 0, got {exponent!r}")
    bw = np.asarray(cluster.bandwidth_matrix(), dtype=np.float64)
    D = bw.shape[0]
    off = ~np.eye(D, dtype=bool)
    w = np.ones((D, D))
    if D > 1 and e > 0:
        w[off] = (bw[off].max() / bw[off]) ** e
    np.fill_diagonal(w, 0.0)
    return w


def chain_score(
    logp: np.ndarray, path: np.ndarray, penalty: float, weights: np.ndarray | None = None
) -> float:
    """Unnormalised log-score of ``path`` under the chain model (``-inf`` if it is masked)."""
    p = np.asarray(path, dtype=np.int64)
    s = float(logp[np.arange(len(p)), p].sum())
    if weights is None:
        return s - float(penalty) * int((p[1:] != p[:-1]).sum())
    w = np.asarray(weights, dtype=np.float64)
    ch = p[1:] != p[:-1]
    return s - float(penalty) * float(w[p[:-1][ch], p[1:][ch]].sum())


def check_penalty(penalty: Any) -> float:
    """A device-change penalty: a finite number ``>= 0`` (NaN used to pass ``penalty < 0``
    and decode every unit independently of its neighbours, inf to forbid every change)."""
    if (
        isinstance(penalty, bool)
        or not isinstance(penalty, numbers.Real)
        or not (math.isfinite(penalty) and penalty >= 0)
    ):
        raise ValueError(f"penalty must be a finite number >= 0, got {penalty!r}")
    return float(penalty)


def viterbi(
    logp: np.ndarray, penalty: float, weights: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """The most likely placement of the chain model and its score.

    Args:
        logp: ``(U, D)`` per-unit log-probabilities (``-inf`` where forbidden).
        penalty: log-probability cost of each device change (``>= 0``).
        weights: ``(D, D)`` multipliers of the penalty per change ``a -> b``
            (:func:`link_weights`; ``None``: 1 for every change).

    Returns ``(path (U,) int64, chain_score(logp, path, penalty, weights))``. Ties go to
    staying on the previous device, then to the lowest device index.
    """
    check_penalty(penalty)
    U, D = logp.shape
    if U == 0:
        return np.zeros(0, dtype=np.int64), 0.0
    trans = _transition(D, penalty, weights)
    score = logp[0].copy()
    back = np.zeros((U, D), dtype=np.int64)
    eye = np.arange(D)
    for u in range(1, U):
        cand = score[:, None] + trans  # (prev, next)
        best_prev = cand.argmax(axis=0)
        stay = cand[eye, eye] >= cand[best_prev, eye]  # prefer staying on ties
        best_prev = np.where(stay, eye, best_prev)
        back[u] = best_prev
        score = cand[best_prev, eye] + logp[u]
    path = np.empty(U, dtype=np.int64)
    path[-1] = int(score.argmax())
    for u in range(U - 1, 0, -1):
        path[u - 1] = back[u, path[u]]
    return path, float(score[path[-1]])


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    mx = np.max(x, axis=axis, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    return np.squeeze(mx, axis=axis) + np.log(np.exp(x - mx).sum(axis=axis))


def sample_chain(
    logp: np.ndarray,
    penalty: float,
    rng: np.random.Generator,
    n: int,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """``n`` exact samples ``(n, U)`` of the chain model (forward filtering, backward sampling)."""
    check_penalty(penalty)
    U, D = logp.shape
    out = np.zeros((n, U), dtype=np.int64)
    if U == 0 or n == 0:
        return out
    trans = _transition(D, penalty, weights)
    alpha = np.empty((U, D))
    alpha[0] = logp[0]
    with np.errstate(invalid="ignore"):
        for u in range(1, U):
            alpha[u] = logp[u] + _logsumexp(alpha[u - 1][:, None] + trans, axis=0)

    def draw(scores: np.ndarray) -> np.ndarray:  # Gumbel-max over the last axis
        g = rng.gumbel(size=scores.shape)
        return np.argmax(np.where(np.isfinite(scores), scores + g, -np.inf), axis=-1)

    out[:, -1] = draw(np.broadcast_to(alpha[-1], (n, D)))
    for u in range(U - 2, -1, -1):
        out[:, u] = draw(alpha[u][None, :] + trans[:, out[:, u + 1]].T)
    return out


def candidates(
    logp: np.ndarray,
    penalties: float | Sequence[float],
    samples: int,
    *,
    greedy: bool = True,
    rng: np.random.Generator,
    temperature: float = 1.0,
    weights: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The ``samples`` placements chain decoding scores, in order.

    With ``greedy``, first the Viterbi placement of each penalty (at most ``samples`` of
    them, in the order given, from ``logp`` itself); the rest are chain samples of
    ``logp / temperature`` (> 1: flatter unit distributions, the same penalty), shared out
    over the penalties in turn (the first penalties get one more when they do not divide
    evenly). ``weights``: per-change multipliers of the penalties (:func:`link_weights`).
    """
    pens = [float(penalties)] if np.isscalar(penalties) else [float(p) for p in penalties]
    if not pens:
        raise ValueError("penalties must name at least one penalty")
    temperature = float(temperature)
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    out: list[np.ndarray] = []
    if greedy:
        out += [viterbi(logp, p, weights)[0] for p in pens[:samples]]
    rest = samples - len(out)
    for i, p in enumerate(pens):
        k = rest // len(pens) + (i < rest % len(pens))
        if k > 0:
            out += list(sample_chain(logp / temperature, p, rng, k, weights))
    return out


def bottleneck_edges(units: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """The unit positions ``i`` (``1 <= i < U``) where ``units`` changes device into or out
    of its busiest device (``argmax busy`` over the devices it uses): the edges of the
    bottleneck device's runs along the unit order. Empty when one device holds every unit."""
    units = np.asarray(units, dtype=np.int64)
    busy = np.asarray(busy, dtype=np.float64)
    if len(units) < 2:
        return np.zeros(0, dtype=np.int64)
    used = np.unique(units)
    b = int(used[np.argmax(busy[used])])
    change = np.flatnonzero(units[1:] != units[:-1]) + 1
    on_b = (units[change] == b) | (units[change - 1] == b)
    return change[on_b]


def resample_window(
    logp: np.ndarray,
    base: np.ndarray,
    penalty: float,
    rng: np.random.Generator,
    *,
    window: int,
    temperature: float = 1.0,
    around: int | None = None,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, int, int]:
    """``base`` with the units ``[start, start + length)`` redrawn: ``length`` uniform in
    ``1..window`` (at most the number of units), ``start`` uniform; the window's devices are
    an exact sample of the chain model with the window's log-probabilities divided by
    ``temperature`` (> 1: flatter), conditioned on every unit outside it keeping its device in
    ``base`` (the device changes at the window's two edges pay the penalty too). Returns
    ``(placement, start, length)``; the placement may equal ``base``.

    ``around``: a unit the window must contain (``start`` then uniform over the windows of
    that length that hold it), e.g. the first unit after a device change of the plan's
    bottleneck device (:func:`bottleneck_edges`). ``weights``: per-change multipliers of the
    penalty (:func:`link_weights`)."""
    U, D = logp.shape
    base = np.asarray(base, dtype=np.int64)
    if base.shape != (U,):
        raise ValueError(f"resample_window: base has shape {base.shape}, expected ({U},)")
    if int(window) < 1:
        raise ValueError(f"resample_window: window must be >= 1, got {window}")
    if not temperature > 0:
        raise ValueError(f"resample_window: temperature must be > 0, got {temperature}")
    if U == 0:
        return base.copy(), 0, 0
    length = int(rng.integers(1, min(int(window), U) + 1))
    if around is None:
        start = int(rng.integers(0, U - length + 1))
    else:
        if not 0 <= int(around) < U:
            raise ValueError(f"resample_window: around={around} is not a unit in [0, {U})")
        lo, hi = max(0, int(around) - length + 1), min(int(around), U - length)
        start = int(rng.integers(lo, hi + 1))
    cond = np.full((U, D), -np.inf)
    cond[np.arange(U), base] = 0.0
    cond[start : start + length] = logp[start : start + length] / float(temperature)
    return sample_chain(cond, penalty, rng, 1, weights)[0], start, length
