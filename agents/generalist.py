"""The pretrained generalist placer: its training corpus, teachers, behaviour cloning and export.

The generalist is a GDP network (:class:`agents.policies.gdp.GDPNet`) that reads the
size-invariant observation of ``placement_env/OneShot-v0`` (costs normalised by the
instance, positions in the work and in the cluster, device speeds relative to the
fastest, link bandwidths relative to the fastest link) and scores every (unit, device)
pair; clusters enter through the device-graph encoder, so one set of weights plans 2 to
16 devices and more. It is trained by **behaviour cloning** of teacher plans (the best of
a list of classic planners, then annealing from it) over :data:`CORPUS`, which leaves
whole model families and whole cluster kinds out (see ``docs/generalisation.md``).

Pipeline (``scripts/train_generalist.py`` runs it):

1. :func:`corpus_instances` lists the training (or held-out) problems: zoo graphs at several
   sizes, synthetic DAGs of several shapes, clusters drawn by :func:`sample_cluster`;
2. :func:`teacher_plan` labels each with the best teacher plan (cached on disk, resumable);
3. :func:`train_bc` fits the network to the labels (cross-entropy per unit, checkpointed);
4. :func:`generalist_payload` / :func:`save_generalist` write the ``load_policy`` file with
   its provenance; ``agents.load_policy("generalist")`` reads the shipped copy.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph

#: Where the shipped policy lives (package data, see ``pyproject.toml``).
PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
#: Names ``agents.load_policy`` resolves to a shipped file.
SHIPPED: dict[str, str] = {"generalist": "generalist.pt"}
#: The env the generalist plans with (one step places every unit).
ENV_ID = "placement_env/OneShot-v0"
#: Teachers, tried in order; the fastest feasible plan is the label. A newly registered
#: baseline (``ideal_dp``, an exact ``ilp``) plugs in by name.
DEFAULT_TEACHERS: tuple[str, ...] = ("pipedream_dp", "metis", "expert", "m_sct")

# --------------------------------------------------------------------------- clusters
#: Device types clusters are drawn from: (peak FLOP/s at the training precision, memory
#: bandwidth B/s, memory bytes, efficiency). Vendor datasheet figures, as in ``conf/cluster``.
DEVICE_TYPES: dict[str, tuple[float, float, float, float]] = {
    "k40": (4.29e12, 288e9, 12 * 2**30, 0.5),
    "p100": (21.2e12, 732e9, 16 * 2**30, 0.4),
    "v100": (125e12, 900e9, 16 * 2**30, 0.4),
    "t4": (65e12, 320e9, 16 * 2**30, 0.3),
    "a10": (125e12, 600e9, 24 * 2**30, 0.35),
    "a100": (312e12, 2.0e12, 40 * 2**30, 0.4),
    "h100": (989e12, 3.35e12, 80 * 2**30, 0.4),
}
#: Link classes: (bandwidth B/s per direction, latency s).
LINK_TYPES: dict[str, tuple[float, float]] = {
    "nvlink": (150e9, 1e-6),
    "nvlink4": (450e9, 1e-6),
    "pcie3": (12e9, 2.5e-6),
    "pcie4": (24e9, 2.5e-6),
    "upi": (20e9, 1e-6),
    "ib_hdr": (25e9, 2.5e-6),
    "ib_ndr": (50e9, 2.5e-6),
    "eth10": (1.25e9, 10e-6),
    "eth100": (12.5e9, 5e-6),
}
#: Cluster kinds :func:`sample_cluster` builds. ``mesh`` and ``eth_hosts`` are held out.
CLUSTER_KINDS: tuple[str, ...] = ("nvswitch", "pcie", "ib_hosts", "eth_hosts")


def _link_pair(a: int, b: int, kind: str, scale: float = 1.0) -> list[Link]:
    bw, lat = LINK_TYPES[kind]
    return [Link(a, b, bw * scale, lat, kind), Link(b, a, bw * scale, lat, kind)]


def sample_cluster(
    rng: np.random.Generator,
    kind: str,
    num_devices: int,
    *,
    hetero: bool = False,
    types: Sequence[str] | None = None,
) -> Cluster:
    """A cluster of ``num_devices`` devices of one topology ``kind``, drawn with ``rng``.

    Kinds: ``nvswitch`` (one host, every device on one NVLink switch), ``pcie`` (one host,
    one or two sockets, 2-4 devices per PCIe switch, sockets joined by UPI), ``ib_hosts``
    (hosts of up to 8 devices on an NVSwitch, one InfiniBand NIC per device to a fabric
    switch), ``eth_hosts`` (hosts of up to 4 devices on PCIe, one Ethernet NIC per host).
    ``hetero`` mixes two device types (devices ordered fast first within a host); else one
    type, drawn from ``types`` (default: every type of :data:`DEVICE_TYPES`).
    """
    if kind not in CLUSTER_KINDS:
        raise ValueError(f"unknown cluster kind {kind!r}; expected one of {CLUSTER_KINDS}")
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    pool = list(types or DEVICE_TYPES)
    picked = [
        str(t) for t in rng.choice(pool, size=2 if hetero and len(pool) > 1 else 1, replace=False)
    ]
    D = int(num_devices)
    per_host = {"nvswitch": D, "pcie": D, "ib_hosts": min(8, D), "eth_hosts": min(4, D)}[kind]
    if kind in ("ib_hosts", "eth_hosts") and D > 2:  # at least two hosts
        per_host = min(per_host, int(math.ceil(D / 2)))
    hosts = int(math.ceil(D / per_host))
    devices = []
    for d in range(D):
        h, local = divmod(d, per_host)
        t = picked[0] if len(picked) == 1 or local < (per_host + 1) // 2 else picked[1]
        peak, mbw, mem, eff = DEVICE_TYPES[t]
        devices.append(Device(f"gpu{d}", t, peak, mbw, mem, eff, 5e-6))
    switches: list[str] = []
    links: list[Link] = []

    def switch(name: str) -> int:
        switches.append(name)
        return D + len(switches) - 1

    intra = str(rng.choice(["nvlink", "nvlink4"])) if kind in ("nvswitch", "ib_hosts") else None
    pcie = str(rng.choice(["pcie3", "pcie4"]))
    fabric = -1
    if kind == "ib_hosts":
        fabric = switch("ib")
    elif kind == "eth_hosts":
        fabric = switch("eth")
    nic = {
        "ib_hosts": str(rng.choice(["ib_hdr", "ib_ndr"])),
        "eth_hosts": str(rng.choice(["eth10", "eth100"])),
    }
    for h in range(hosts):
        members = [d for d in range(D) if d // per_host == h]
        if intra is not None:
            s = switch(f"nvswitch{h}")
            for d in members:
                links += _link_pair(d, s, intra)
        else:
            sockets = 2 if len(members) >= 4 and rng.random() < 0.5 else 1
            cpus = [switch(f"h{h}cpu{k}") for k in range(sockets)]
            if sockets == 2:
                links += _link_pair(cpus[0], cpus[1], "upi")
            group = int(rng.integers(2, 5))
            for k in range(0, len(members), group):
                sw = switch(f"h{h}pcie{k // group}")
                cpu = cpus[min(k * sockets // len(members), sockets - 1)]
                links += _link_pair(sw, cpu, pcie)
                for d in members[k : k + group]:
                    links += _link_pair(d, sw, pcie)
        if kind == "ib_hosts":
            for d in members:
                links += _link_pair(d, fabric, nic["ib_hosts"])
        elif kind == "eth_hosts":
            links += _link_pair(D + switches.index(f"h{h}cpu0"), fabric, nic["eth_hosts"])
    if D == 1:
        links = []
    name = f"{kind}_{D}x{'+'.join(picked)}"
    return Cluster(name, tuple(devices), tuple(links), tuple(switches), {"kind": kind})


# --------------------------------------------------------------------------- corpus
@dataclass(frozen=True)
class GraphSource:
    """A graph of the corpus: a zoo model with a config, or a synthetic draw."""

    family: str  # "decoder", "encoder", "moe", "cnn", "rnn", "seq2seq", "vision_transformer", "synthetic"
    model: str  # zoo name, or synthetic kind
    config: Mapping[str, Any] = field(default_factory=dict)
    max_groups: int = 128

    @property
    def label(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return (
            f"{self.model}[{cfg}]@{self.max_groups}" if cfg else f"{self.model}@{self.max_groups}"
        )

    def build(self, seed: int = 0) -> CompGraph:
        if self.family == "synthetic":
            from graphs import synthetic

            rng = np.random.default_rng(seed)
            return synthetic.sample(rng, self.model, **dict(self.config))
        from graphs import zoo

        return zoo.build(self.model, max_groups=self.max_groups, **dict(self.config))


@dataclass(frozen=True)
class Corpus:
    """The training corpus and its held-out split.

    Attributes:
        train_graphs: zoo graphs the teacher labels (each on ``clusters_per_graph`` clusters).
        synthetic: synthetic graph kinds, ``synthetic_per_kind`` draws each, one cluster each.
        train_kinds, heldout_kinds: cluster kinds (``heldout`` also names presets).
        heldout_graphs: families never seen in training.
        devices: device counts clusters are drawn with.
        microbatches, schedules: drawn per instance.
    """

    train_graphs: tuple[GraphSource, ...]
    heldout_graphs: tuple[GraphSource, ...]
    synthetic: tuple[str, ...] = ("layered", "series_parallel", "nasnet")
    synthetic_per_kind: int = 30
    synthetic_ops: tuple[int, int] = (20, 160)
    train_kinds: tuple[str, ...] = ("nvswitch", "pcie", "ib_hosts")
    heldout_kinds: tuple[str, ...] = ("eth_hosts", "preset:dgx1_v100_8")
    devices: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)
    heldout_devices: tuple[int, ...] = (4, 8)
    clusters_per_graph: int = 8
    microbatches: tuple[int, ...] = (1, 4, 8, 16)
    schedules: tuple[str, ...] = ("gpipe", "1f1b")
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["train_graphs"] = [g.label for g in self.train_graphs]
        d["heldout_graphs"] = [g.label for g in self.heldout_graphs]
        return d


#: The corpus of the shipped generalist. Held out: the encoder family (BERT), the
#: Inception CNN family, Ethernet multi-host clusters and the DGX-1 hybrid cube-mesh.
CORPUS = Corpus(
    train_graphs=(
        GraphSource("decoder", "gpt2", {"n_layer": 2, "d_model": 256, "n_head": 4, "seq": 256}, 64),
        GraphSource(
            "decoder", "gpt2", {"n_layer": 4, "d_model": 256, "n_head": 4, "seq": 256}, 128
        ),
        GraphSource(
            "decoder", "gpt2", {"n_layer": 8, "d_model": 512, "n_head": 8, "seq": 512}, 128
        ),
        GraphSource("decoder", "gpt2", {}, 128),
        GraphSource(
            "decoder",
            "llama",
            {"n_layer": 4, "d_model": 512, "n_head": 8, "n_kv_head": 8, "d_ff": 1408, "seq": 512},
            128,
        ),
        GraphSource(
            "moe",
            "mixtral",
            {
                "n_layer": 2,
                "d_model": 256,
                "n_head": 4,
                "n_kv_head": 2,
                "d_ff": 512,
                "n_expert": 4,
                "seq": 256,
            },
            128,
        ),
        GraphSource("cnn", "resnet50", {"image_size": 128}, 128),
        GraphSource("vision_transformer", "vit-base", {"n_layer": 6}, 128),
        GraphSource("rnn", "rnnlm", {}, 128),
        GraphSource("seq2seq", "nmt", {}, 128),
    ),
    heldout_graphs=(
        GraphSource("encoder", "bert-base", {}, 128),
        GraphSource("encoder", "bert-large", {}, 256),
        GraphSource("inception", "inception-v3", {}, 128),
    ),
)


#: A nested split of :data:`CORPUS` for choosing training and decoding settings by *transfer*
#: (the held-out pairs are unseen families on unseen cluster kinds; the validation draw of
#: :func:`validation_instances` has neither): the vision transformer (an encoder-style
#: transformer, like BERT) and ResNet-50 (the CNN, like Inception) are taken out of
#: training, and so are single-host PCIe clusters (like the held-out PCIe-and-Ethernet
#: hosts). Its held-out pairs: those two graphs on PCIe clusters of 4, 6, 8 and 12 devices
#: (8 rows). It never contains a family or cluster kind of ``CORPUS``'s held-out split.
TRANSFER_CORPUS = replace(
    CORPUS,
    train_graphs=tuple(g for g in CORPUS.train_graphs if g.model not in ("vit-base", "resnet50")),
    heldout_graphs=tuple(g for g in CORPUS.train_graphs if g.model in ("vit-base", "resnet50")),
    train_kinds=("nvswitch", "ib_hosts"),
    heldout_kinds=("pcie",),
    heldout_devices=(4, 6, 8, 12),
)

#: The confirmation set of link-aware chain decoding (``docs/generalisation.md``, 29 Nov 2026):
#: fresh draws of the held-out Ethernet kind (corpus seed 1, so other clusters than the held-out
#: pairs'; 4, 6, 8 and 12 devices) under the held-out families and three training families
#: (8 microbatches, 1F1B). None of its pairs is a held-out pair or was trained on.
LINK_CHECK_CORPUS = replace(
    CORPUS,
    seed=1,
    heldout_graphs=CORPUS.heldout_graphs
    + tuple(
        g
        for g in CORPUS.train_graphs
        if g.model in ("resnet50", "nmt") or (g.model == "gpt2" and g.config.get("n_layer") == 8)
    ),
    heldout_kinds=("eth_hosts",),
    heldout_devices=(4, 6, 8, 12),
)

#: Corpora by name (``--corpus`` of the generalist scripts).
CORPORA: dict[str, Corpus] = {
    "shipped": CORPUS,
    "transfer": TRANSFER_CORPUS,
    "linkcheck": LINK_CHECK_CORPUS,
}


def corpus_named(name: str) -> Corpus:
    """The corpus registered as ``name`` (``ValueError`` listing the names)."""
    try:
        return CORPORA[name]
    except KeyError:
        raise ValueError(f"unknown corpus {name!r}; available: {sorted(CORPORA)}") from None


@dataclass
class Problem:
    """One corpus problem: a graph on a cluster with a pipeline schedule."""

    name: str
    graph: CompGraph
    cluster: Cluster
    microbatches: int
    schedule: str
    split: str  # "train" or "heldout"

    def oracle(self) -> Any:
        from placement_env.oracles.simulator import Simulator

        return Simulator(
            self.graph, self.cluster, microbatches=self.microbatches, schedule=self.schedule
        )


def heldout_clusters(corpus: Corpus = CORPUS) -> list[Cluster]:
    """The held-out clusters: presets named ``preset:NAME`` and draws of held-out kinds."""
    from graphs import clusters

    out = []
    rng = np.random.default_rng(corpus.seed + 7919)
    for kind in corpus.heldout_kinds:
        if kind.startswith("preset:"):
            out.append(clusters.load(kind.split(":", 1)[1]))
            continue
        for d in corpus.heldout_devices:
            out.append(sample_cluster(rng, kind, d, hetero=d == 8))
    return out


def corpus_instances(
    corpus: Corpus = CORPUS, *, split: str = "train", log: Any = None
) -> list[Problem]:
    """The problems of ``split`` (``"train"`` or ``"heldout"``), deterministic for the corpus seed.

    Training: every training graph on ``clusters_per_graph`` clusters of the training kinds
    (device counts, homogeneity, microbatches and schedule drawn), plus the synthetic draws.
    Held out: every held-out graph on every held-out cluster (8 microbatches, 1F1B, the
    default experiment's schedule).
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = np.random.default_rng(corpus.seed)
    out: list[Problem] = []
    if split == "heldout":
        cls = heldout_clusters(corpus)
        for src in corpus.heldout_graphs:
            g = src.build()
            for c in cls:
                out.append(Problem(f"{src.label} @ {c.name}", g, c, 8, "1f1b", "heldout"))
        return out

    def draw_cluster() -> Cluster:
        kind = str(rng.choice(corpus.train_kinds))
        d = int(rng.choice(corpus.devices))
        return sample_cluster(rng, kind, d, hetero=bool(rng.random() < 0.4))

    def pipeline() -> tuple[int, str]:
        return int(rng.choice(corpus.microbatches)), str(rng.choice(corpus.schedules))

    for src in corpus.train_graphs:
        t0 = time.perf_counter()
        g = src.build()
        if log:
            log(f"graph {src.label}: {g.num_nodes} nodes ({time.perf_counter() - t0:.1f} s)")
        for _ in range(corpus.clusters_per_graph):
            c = draw_cluster()
            m, s = pipeline()
            out.append(Problem(f"{src.label} @ {c.name}", g, c, m, s, "train"))
    lo, hi = corpus.synthetic_ops
    for kind in corpus.synthetic:
        src = GraphSource("synthetic", kind, {"min_nodes": lo, "max_nodes": hi})
        for _ in range(corpus.synthetic_per_kind):
            seed = int(rng.integers(2**31))
            g = src.build(seed)
            c = draw_cluster()
            m, s = pipeline()
            out.append(Problem(f"synthetic-{kind}#{seed} @ {c.name}", g, c, m, s, "train"))
    return out


# --------------------------------------------------------------------------- teachers
def validation_instances(rows: int, seed: int = 1, corpus: Corpus = CORPUS) -> list[Problem]:
    """The validation draw: training-split problems of ``corpus`` drawn with ``seed`` (1 is
    kept out of every shipped training run), every k-th of them, ``rows`` in all -- the
    same families, cluster kinds and sizes as training, different draws, no held-out
    family or cluster kind (``scripts/validate_generalist.py``,
    ``scripts/finetune_generalist.py --split validation``)."""
    probs = corpus_instances(replace(corpus, seed=seed), split="train")
    return probs[:: max(1, len(probs) // rows)][:rows]


#: Teachers that take a ``time_limit`` (s): the exact planners.
TIMED_TEACHERS: tuple[str, ...] = ("ideal_dp", "ilp")


def _teacher_placements(
    problem: Problem,
    teachers: Sequence[str],
    oracle: Any,
    *,
    seed: int,
    teacher_seconds: float | None,
    student: Any,
    student_samples: int,
) -> list[tuple[float, np.ndarray, str]]:
    """``(step time, node placement, name)`` of every teacher that finds a feasible plan, in
    ``teachers`` order, then the student's (see :func:`teacher_plan`)."""
    from agents import baselines

    if teacher_seconds is not None and not teacher_seconds > 0:
        raise ValueError(f"teacher_seconds must be > 0, got {teacher_seconds}")
    out = []
    for name in teachers:
        opts = {}
        if teacher_seconds is not None and name in TIMED_TEACHERS:
            opts["time_limit"] = float(teacher_seconds)
        try:
            p = baselines.get(name)(problem.graph, problem.cluster, oracle, **opts)
        except baselines.InfeasiblePlanError:
            continue
        out.append((float(p.meta["step_time"]), np.asarray(p.placement), name))
    if student is not None:
        try:  # the fastest memory-feasible placement of its samples
            p = student.plan(
                problem.graph, problem.cluster, microbatches=problem.microbatches,
                schedule=problem.schedule, samples=student_samples, oracle=oracle, seed=seed,
            )  # fmt: skip
        except baselines.InfeasiblePlanError:
            p = None
        if p is not None:
            out.append((float(p.meta["step_time"]), np.asarray(p.placement), "student"))
    if not out:
        raise baselines.InfeasiblePlanError(f"no teacher found a feasible plan of {problem.name}")
    return out


def _annealed(
    problem: Problem, oracle: Any, t: float, placement: np.ndarray, name: str, calls: int, seed: int
) -> tuple[float, np.ndarray, str]:
    """``anneal`` for ``calls`` calls from a teacher's placement; the better of the two
    (``name + "+anneal"`` when annealing improved it)."""
    from agents import baselines

    if calls > 0:
        p = baselines.get("anneal")(
            problem.graph, problem.cluster, oracle, calls, init=placement, seed=seed
        )
        if float(p.meta["step_time"]) < t:
            return float(p.meta["step_time"]), np.asarray(p.placement), name + "+anneal"
    return t, placement, name


def _units(problem: Problem, placement: np.ndarray) -> np.ndarray:
    from placement_env.encoding import unit_graph

    ug = unit_graph(problem.graph)
    units = np.zeros(ug.num_units, dtype=np.int64)
    units[ug.node_unit] = placement
    return units


def teacher_plan(
    problem: Problem,
    teachers: Sequence[str] = DEFAULT_TEACHERS,
    *,
    anneal_calls: int = 300,
    seed: int = 0,
    teacher_seconds: float | None = None,
    student: Any = None,
    student_samples: int = 1024,
) -> tuple[np.ndarray, float, str]:
    """The label of ``problem``: the fastest feasible teacher plan, then annealed.

    ``teacher_seconds``: the ``time_limit`` given to the exact planners among the teachers
    (:data:`TIMED_TEACHERS`; ``None``: their own default, 60 s). Stopped early they return
    their best plan so far, which still competes as a label.

    ``student``: an :class:`~agents.export.ExportedPolicy` whose zero-shot plan
    (``student_samples`` chain samples, ``seed``) competes as one more teacher, named
    ``"student"`` -- one round of expert iteration: the label is the policy's own plan
    wherever that beats the classic teachers, improved by the same annealing.

    Returns ``(unit placement (U,), step time s, teacher name)``; ``name`` gets
    ``+anneal`` when annealing improved it. ``InfeasiblePlanError`` when no teacher finds a
    feasible plan.
    """
    oracle = problem.oracle()
    found = _teacher_placements(
        problem, teachers, oracle, seed=seed, teacher_seconds=teacher_seconds, student=student,
        student_samples=student_samples,
    )  # fmt: skip
    best = found[0]
    for cand in found[1:]:  # the first of the fastest
        if cand[0] < best[0]:
            best = cand
    t, placement, name = _annealed(problem, oracle, *best, anneal_calls, seed)
    return _units(problem, placement), t, name


def teacher_candidates(
    problem: Problem,
    teachers: Sequence[str] = DEFAULT_TEACHERS,
    *,
    anneal_calls: int = 300,
    seed: int = 0,
    teacher_seconds: float | None = None,
    student: Any = None,
    student_samples: int = 1024,
) -> list[tuple[np.ndarray, float, str]]:
    """Every distinct teacher plan of ``problem`` (the arguments of :func:`teacher_plan`),
    each annealed ``anneal_calls`` calls from itself (``seed``), fastest first (ties in
    teacher order), each resulting placement once (two starts may anneal to one):
    ``[(unit placement, step time, name), ...]``. :func:`teacher_plan`
    anneals only the teacher that was fastest *before* annealing; here a slower teacher whose
    plan anneals further can win (``label_corpus(mode="each" | "near")``)."""
    oracle = problem.oracle()
    found = _teacher_placements(
        problem, teachers, oracle, seed=seed, teacher_seconds=teacher_seconds, student=student,
        student_samples=student_samples,
    )  # fmt: skip
    starts: dict[bytes, tuple] = {}  # a placement two teachers give is annealed once
    for t, placement, name in found:
        starts.setdefault(placement.tobytes(), (t, placement, name))
    annealed = sorted(  # stable: teacher order among equal times
        (_annealed(problem, oracle, *x, anneal_calls, seed) for x in starts.values()),
        key=lambda x: x[0],
    )
    ends: dict[bytes, tuple] = {}
    for t, placement, name in annealed:
        ends.setdefault(placement.tobytes(), (_units(problem, placement), t, name))
    return list(ends.values())


def policy_fingerprint(policy: Any) -> str:
    """A short SHA-256 of a policy's network weights (names, shapes, dtypes and bytes of its
    ``state_dict``, in order): equal for the same weights wherever they were loaded from."""
    import hashlib

    h = hashlib.sha256()
    net = getattr(policy, "net", policy)
    for name, t in net.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


#: How :func:`label_corpus` labels a problem: ``"best"`` (the shipped recipe,
#: :func:`teacher_plan`: the teacher fastest before annealing, annealed), ``"each"`` (the
#: fastest of :func:`teacher_candidates`: every teacher's plan annealed), ``"near"`` (every
#: candidate within ``tolerance`` of that fastest: one training sample each).
LABEL_MODES: tuple[str, ...] = ("best", "each", "near")


def label_settings(
    teachers: Sequence[str],
    anneal_calls: int,
    teacher_seconds: float | None,
    student: Any = None,
    student_samples: int = 1024,
    mode: str = "best",
    tolerance: float = 0.05,
) -> dict[str, Any]:
    """What a label of :func:`teacher_plan` depends on besides its problem: stored with each
    cached label, so a cache is reused only by a run that would compute the same labels.
    ``mode`` and ``tolerance`` (:data:`LABEL_MODES`) are recorded only when the mode is not
    ``"best"``, so caches written before the modes existed stay valid."""
    out = {
        "teachers": list(teachers),
        "anneal_calls": int(anneal_calls),
        "teacher_seconds": None if teacher_seconds is None else float(teacher_seconds),
        "student": None if student is None else policy_fingerprint(student),
        "student_samples": None if student is None else int(student_samples),
    }
    if mode != "best":
        out["mode"] = mode
        if mode == "near":
            out["tolerance"] = float(tolerance)
    return out


def check_label_mode(mode: str, tolerance: float) -> None:
    """``ValueError`` naming a mode not in :data:`LABEL_MODES` or a tolerance that is not a
    number >= 0."""
    if mode not in LABEL_MODES:
        raise ValueError(f"label mode {mode!r}: expected one of {list(LABEL_MODES)}")
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float))
        or not (tolerance >= 0 and math.isfinite(tolerance))
    ):
        raise ValueError(f"label tolerance {tolerance!r}: expected a finite number >= 0")


def problem_key(problem: Problem) -> str:
    """A label cache's key of ``problem``: its name, microbatches, schedule and the content
    hashes of its graph and cluster. Names alone are not unique: a draw of the corpus can
    hold two problems of one name (cluster names give kind, size and device types, not the
    links; the name gives neither microbatches nor schedule)."""
    return (
        f"{problem.name} | M={problem.microbatches} {problem.schedule} | "
        f"graph={problem.graph.content_hash()} | cluster={problem.cluster.content_hash()}"
    )


def label_corpus(
    problems: Sequence[Problem],
    cache: Path,
    *,
    teachers: Sequence[str] = DEFAULT_TEACHERS,
    anneal_calls: int = 300,
    log: Any = None,
    teacher_seconds: float | None = None,
    student: Any = None,
    student_samples: int = 1024,
    mode: str = "best",
    tolerance: float = 0.05,
) -> list[dict[str, Any]]:
    """Teacher labels of ``problems``, read from / appended to the JSON-lines file ``cache``
    (so an interrupted run resumes). Problems no teacher can place are skipped.

    ``mode`` (:data:`LABEL_MODES`): ``"best"`` labels with :func:`teacher_plan`; ``"each"``
    with the fastest of :func:`teacher_candidates`; ``"near"`` likewise, and adds under
    ``"extra"`` every other candidate within ``tolerance`` (relative) of it whose placement
    differs from the label's and from the extras before it
    (``units``, ``step_time``, ``teacher`` each), which :func:`label_pairs` turns into
    samples of their own.

    Each line records its problem's :func:`problem_key` and the settings it was made with
    (:func:`label_settings`: teachers, annealing calls, the exact teachers' time limit, the
    student's weights); a cached label is reused only for the same key and settings, else
    the problem is labelled again (and ``log`` says how many were). Lines written before
    keys and settings were recorded (28 Nov 2026) are never reused."""
    check_label_mode(mode, tolerance)
    settings = label_settings(
        teachers, anneal_calls, teacher_seconds, student, student_samples, mode, tolerance
    )
    done: dict[str, dict[str, Any]] = {}
    other: set[str] = set()
    if cache.exists():
        for line in cache.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if "key" in r and r.get("settings") == settings:
                    done[r["key"]] = r
                else:  # other settings, or a line from before keys (its name only)
                    other.add(r.get("key", r["name"]))
    keys = [problem_key(pb) for pb in problems]
    stale = sum(k not in done and (k in other or pb.name in other) for pb, k in zip(problems, keys))
    if stale and log:
        log(
            f"{cache}: {stale} cached label(s) were made with other settings than "
            f"{settings}; labelling them again"
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    out = []
    with cache.open("a") as f:
        for i, (pb, key) in enumerate(zip(problems, keys)):
            if key not in done:
                t0 = time.perf_counter()
                kw = dict(
                    anneal_calls=anneal_calls, seed=i, teacher_seconds=teacher_seconds,
                    student=student, student_samples=student_samples,
                )  # fmt: skip
                extra: list[tuple[np.ndarray, float, str]] = []
                try:
                    if mode == "best":
                        units, t, who = teacher_plan(pb, teachers, **kw)
                    else:
                        cands = teacher_candidates(pb, teachers, **kw)
                        units, t, who = cands[0]
                        if mode == "near":
                            extra = [c for c in cands[1:] if c[1] <= t * (1 + tolerance)]
                except Exception as exc:  # infeasible or a planner refusing the instance
                    done[key] = {"name": pb.name, "error": str(exc)}
                else:
                    done[key] = {
                        "name": pb.name,
                        "units": units.tolist(),
                        "step_time": t,
                        "teacher": who,
                        "seconds": time.perf_counter() - t0,
                    }
                    if mode == "near":
                        done[key]["extra"] = [
                            {"units": u.tolist(), "step_time": tt, "teacher": w}
                            for u, tt, w in extra
                        ]
                done[key].update(key=key, settings=settings)
                f.write(json.dumps(done[key]) + "\n")
                f.flush()
                if log:
                    r = done[key]
                    log(f"[{i + 1}/{len(problems)}] {pb.name}: {r.get('teacher', r.get('error'))}")
            out.append(done[key])
    return out


def label_pairs(
    problems: Sequence[Problem], labels: Sequence[Mapping[str, Any]]
) -> list[tuple[Problem, np.ndarray]]:
    """``(problem, unit placement)`` training pairs of :func:`label_corpus`'s labels: one per
    labelled problem, plus one per ``"extra"`` label (``mode="near"``); problems no teacher
    could place are left out."""
    out = []
    for pb, r in zip(problems, labels, strict=True):
        if "units" in r:
            out.append((pb, np.asarray(r["units"])))
            out += [(pb, np.asarray(x["units"])) for x in r.get("extra", ())]
    return out


# --------------------------------------------------------------------------- observations
def device_classes(cluster: Cluster) -> np.ndarray:
    """Class id of each device: devices equal in every field but the name (type, speeds,
    memory, efficiency, overheads) share one. Labels may swap devices inside a class only."""
    keys: dict[tuple, int] = {}
    out = np.zeros(cluster.num_devices, dtype=np.int64)
    for i, d in enumerate(cluster.devices):
        fields = asdict(d)
        fields.pop("name", None)
        out[i] = keys.setdefault(tuple(sorted((k, repr(v)) for k, v in fields.items())), len(keys))
    return out


def canonical_units(
    problem: Problem, units: np.ndarray, tolerance: float = 1e-9
) -> tuple[np.ndarray, bool]:
    """The label ``units`` with equal devices renamed in order of first use, when that keeps
    its step time.

    Teachers name stages arbitrarily (METIS's part 3 may land on any device of a class), so
    equal plans reach the network under many device names, and behaviour cloning learns
    their blur. Walking the units in their (topological) order, the first device of each
    class the label uses becomes that class's lowest-numbered device, the second the next,
    and so on. Equal devices need not be interchangeable (a PCIe tree, hosts on a network),
    so the renamed label is kept only when the problem's oracle scores it no slower than
    ``1 + tolerance`` times the label (default 1e-9: no slower); else the label is returned
    unchanged. Returns ``(units, renamed)``.
    """
    from placement_env.encoding import unit_graph

    units = np.asarray(units, dtype=np.int64)
    cls = device_classes(problem.cluster)
    free = {int(c): [int(d) for d in np.flatnonzero(cls == c)] for c in np.unique(cls)}
    rename: dict[int, int] = {}
    for d in units:
        d = int(d)
        if d not in rename:
            rename[d] = free[int(cls[d])].pop(0)
    new = np.array([rename[int(d)] for d in units], dtype=np.int64)
    if np.array_equal(new, units):
        return units, False
    ug = unit_graph(problem.graph)
    oracle = problem.oracle()
    before = oracle.evaluate(units[ug.node_unit])
    after = oracle.evaluate(new[ug.node_unit])
    if after.feasible and after.step_time <= before.step_time * (1 + tolerance):
        return new, True
    return units, False


def problem_env(problem: Problem) -> Any:
    """``OneShot-v0`` on this one problem, padded exactly (as ``ExportedPolicy.plan`` pads)."""
    import gymnasium as gym

    import placement_env  # noqa: F401  (registers the envs)
    from placement_env.encoding import instance_bounds
    from placement_env.generators import fixed

    b = instance_bounds(problem.graph, problem.cluster)
    oracle = problem.oracle()
    return gym.make(
        ENV_ID,
        generator=fixed(problem.graph, problem.cluster),
        oracle_factory=lambda g, c: oracle,
        max_nodes=b.max_nodes,
        max_edges=b.max_edges,
        max_devices=b.max_devices,
        disable_env_checker=True,
    )


@dataclass
class Sample:
    """One behaviour-cloning example: the reset observation (logical shapes) and the label."""

    obs: dict[str, np.ndarray]
    mask: np.ndarray  # (U, D) bool action mask
    target: np.ndarray  # (U,) int64 teacher device of each unit
    name: str


def make_sample(problem: Problem, units: np.ndarray) -> Sample:
    """The reset observation of ``problem`` with its teacher label."""
    from placement_env.encoding import obs_shapes

    env = problem_env(problem)
    try:
        obs, _ = env.reset(seed=0)
        b = env.unwrapped.bounds
        mask = env.unwrapped.action_masks().reshape(b.max_nodes, b.max_devices)
    finally:
        env.close()
    shapes = obs_shapes(b)
    logical = {k: np.asarray(v).reshape(shapes[k]) for k, v in obs.items()}
    return Sample(logical, mask, np.asarray(units, dtype=np.int64), problem.name)


def collate(
    samples: Sequence[Sample],
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Pad logical observations to the batch's largest sizes and flatten them again.

    Returns ``(flat obs (B, size) tensors, action mask (B, N, D), targets (B, N) with -1
    on padding)``. Padding rows are zero with mask 0, exactly what a larger env bound gives,
    except ``global_feat``'s ``units_frac`` / ``devices_frac``, which keep each sample's own
    exact-padding value (1), as at planning time.
    """
    N = max(s.obs["node_mask"].shape[0] for s in samples)
    E = max(s.obs["edge_mask"].shape[0] for s in samples)
    D = max(s.obs["device_mask"].shape[0] for s in samples)
    B = len(samples)

    def pad(x: np.ndarray, shape: tuple[int, ...], fill: float = 0) -> np.ndarray:
        out = np.full(shape, fill, dtype=x.dtype)
        out[tuple(slice(0, n) for n in x.shape)] = x
        return out

    keys = samples[0].obs.keys()
    flat: dict[str, torch.Tensor] = {}
    for k in keys:
        rows = []
        for s in samples:
            x = s.obs[k]
            if k in ("node_feat",):
                x = pad(x, (N, x.shape[1]))
            elif k == "edge_feat":
                x = pad(x, (E, x.shape[1]))
            elif k == "edge_index":
                x = pad(x, (2, E))
            elif k == "device_feat":
                x = pad(x, (D, x.shape[1]))
            elif k == "link_feat":
                x = pad(x, (D, D, x.shape[2]))
            elif k == "placement":
                x = pad(x, (N,), -1)
            elif k in ("node_mask",):
                x = pad(x, (N,))
            elif k == "edge_mask":
                x = pad(x, (E,))
            elif k == "device_mask":
                x = pad(x, (D,))
            rows.append(x.reshape(-1))
        flat[k] = torch.as_tensor(np.stack(rows))
    mask = torch.zeros(B, N, D, dtype=torch.bool)
    target = torch.full((B, N), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        U = len(s.target)
        n, d = s.mask.shape
        mask[i, :n, :d] = torch.as_tensor(s.mask)
        target[i, :U] = torch.as_tensor(s.target)
    return flat, mask, target


# --------------------------------------------------------------------------- training
#: Network of the shipped generalist (GDP: graph encoder + Transformer + pair scorer).
NET_CONFIG: dict[str, Any] = {"hidden": 64, "num_layers": 2, "attn_layers": 2, "heads": 4}


def new_network(config: Mapping[str, Any] | None = None) -> Any:
    """A fresh GDP network sized for the current observation encoding."""
    from agents.policies import GDPNet
    from placement_env.encoding import F_DEV, F_EDGE, F_GLOBAL, F_LINK, F_NODE

    return GDPNet(F_NODE + F_GLOBAL, F_EDGE, F_DEV, F_LINK, **{**NET_CONFIG, **dict(config or {})})


def bc_loss(
    net: Any, batch: tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, float]:
    """Mean cross-entropy of the teacher's device per real unit, and the unit accuracy."""
    from agents.export import ACTION_MASK_LOGIT
    from agents.policies.dense import dense_from_obs

    flat, mask, target = batch
    g = dense_from_obs(flat)
    scores, _ = net(g)
    scores = scores.masked_fill(~mask, ACTION_MASK_LOGIT)
    real = target >= 0
    logp = torch.log_softmax(scores, dim=-1)
    tgt = target.clamp_min(0)
    nll = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    loss = (nll * real).sum() / real.sum().clamp_min(1)
    acc = ((scores.argmax(-1) == target) & real).sum().item() / max(int(real.sum()), 1)
    return loss, acc


def train_bc(
    samples: Sequence[Sample],
    *,
    steps: int,
    checkpoint: Path,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    net_config: Mapping[str, Any] | None = None,
    weight_decay: float = 0.0,
    log: Any = None,
    log_every: int = 50,
    max_seconds: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Behaviour cloning: Adam on :func:`bc_loss` over random mini-batches of ``samples``
    (AdamW, decoupled weight decay, when ``weight_decay > 0``).

    Resumable: the network, optimiser, RNG state and step count are saved to
    ``checkpoint`` every ``log_every`` steps and at the end, and read back when present.
    The checkpoint records the run's settings (``seed``, ``lr``, ``batch_size``, ``steps``,
    the network config, the number of samples); resuming with any of them different raises
    ``ValueError`` naming the field (a finished seed-0 checkpoint would otherwise be returned
    as seed 1's network). Returns ``(network, stats)``.
    """
    if not (isinstance(weight_decay, (int, float)) and 0.0 <= weight_decay < 1.0):
        raise ValueError(f"train_bc: weight_decay must be in [0, 1), got {weight_decay!r}")
    torch.manual_seed(seed)
    net = new_network(net_config)
    opt = (
        torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
        if weight_decay > 0
        else torch.optim.Adam(net.parameters(), lr=lr)
    )
    start, history = 0, []
    rng = np.random.default_rng(seed)
    settings = {
        "seed": int(seed),
        "lr": float(lr),
        "batch_size": int(batch_size),
        "steps": int(steps),
        "net_config": {**NET_CONFIG, **dict(net_config or {})},
        "samples": len(samples),
    }
    if weight_decay > 0:  # only when set: checkpoints written before it resume unchanged
        settings["weight_decay"] = float(weight_decay)
    if checkpoint.exists():
        ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
        saved = ck.get("settings")
        for key in sorted(set(settings) | set(saved or {})):
            value = settings.get(key)
            if saved is not None and saved.get(key) != value:
                raise ValueError(
                    f"{checkpoint}: field 'settings.{key}' is {saved.get(key)!r}, but this run "
                    f"has {key}={value!r}; resume with the same settings, or use another work "
                    "directory (or delete the checkpoint) to start afresh"
                )
        net.load_state_dict(ck["net"])
        opt.load_state_dict(ck["opt"])
        start, history = int(ck["step"]), list(ck["history"])
        rng.bit_generator.state = ck["rng"]
        if log:
            log(f"resumed from {checkpoint} at step {start}")
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s + start, steps) / max(steps, 1)))
    )

    def save(step: int) -> None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "net": net.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "history": history,
                "rng": rng.bit_generator.state,
                "settings": settings,
            },
            checkpoint,
        )

    t0 = time.perf_counter()
    net.train()
    run_loss = run_acc = 0.0
    step = start
    for step in range(start + 1, steps + 1):
        idx = rng.choice(len(samples), size=min(batch_size, len(samples)), replace=False)
        loss, acc = bc_loss(net, collate([samples[int(i)] for i in idx]))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        run_loss += loss.item()
        run_acc += acc
        if step % log_every == 0 or step == steps:
            k = log_every if step % log_every == 0 else step % log_every
            history.append((step, run_loss / k, run_acc / k, time.perf_counter() - t0))
            if log:
                log(
                    f"step {step}/{steps}: loss {run_loss / k:.3f}, unit accuracy {run_acc / k:.3f}, {time.perf_counter() - t0:.0f} s"
                )
            run_loss = run_acc = 0.0
            save(step)
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                break
    save(step)
    net.eval()
    return net, {"steps": step, "history": history, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------- export
def generalist_payload(net: Any, *, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``load_policy`` payload of a trained generalist network (OneShot-v0, per-unit): a
    ``GDPNet``, or a ``GDPEnsemble`` of several (``scripts/train_generalist.py --seed 0 1 2``)."""
    from agents.export import network_payload
    from agents.policies import GDPEnsemble

    network = "gdp_ensemble" if isinstance(net, GDPEnsemble) else "gdp"
    return network_payload(net, network=network, mode="per_node", env_id=ENV_ID, meta=meta)


def save_generalist(net: Any, path: Path, *, meta: Mapping[str, Any]) -> Path:
    """Write the generalist's policy file (``torch.load(..., weights_only=True)`` reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(generalist_payload(net, meta=meta), path)
    return path


def shipped_path(name: str) -> Path | None:
    """The file of a shipped policy name (``"generalist"``), or ``None`` if ``name`` is not one."""
    f = SHIPPED.get(str(name))
    return PRETRAINED_DIR / f if f is not None else None
