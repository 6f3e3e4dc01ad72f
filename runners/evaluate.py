"""``python -m runners.evaluate``: a suite of envs x agents x seeds to results.md/.csv and a bar chart."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from runners import common, folder_lock, schema
from runners.train import EARLIER_RUN, check_config, train

schema.register()

COLUMNS = (
    "env",
    "agent",
    "seed",
    "step_time_ms",
    "lower_bound_ms",
    "oom",
    "oracle_calls",
    "wall_seconds",
)


@contextmanager
def _hydra_ready() -> Iterator[None]:
    """Use the running hydra app's config search path, or initialise one on ``conf/``."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=str(common.CONF_DIR), version_base=None):
            yield


def compose_train(overrides: Sequence[str]) -> DictConfig:
    """The ``runners.train`` config for ``overrides`` (hydra's compose API)."""
    from hydra import compose

    with _hydra_ready():
        return compose(config_name="train", overrides=list(overrides))


def cell_overrides(cfg: DictConfig, env: str, agent: str, seed: int) -> list[str]:
    """The train overrides of one cell of the suite."""
    b = cfg.train
    return [
        f"+env={env}",
        f"agent={agent}",
        f"seed={seed}",
        "logger=none",
        "run_baselines=false",
        f"train.timesteps={b.timesteps}",
        f"train.seconds={'null' if b.seconds is None else b.seconds}",
        f"train.checkpoint_every={b.checkpoint_every}",
        f"train.progress={str(bool(b.progress)).lower()}",
        # a key inside env.model_config / agent.options needs no '+' (as on the command line)
        *schema.free_form_overrides(schema.TrainConfig, [str(o) for o in cfg.overrides]),
    ]


def evaluate(
    cfg: DictConfig, run_dir: Path, *, echo: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Run every cell into ``RUN_DIR/ENV/AGENT/sSEED``; write results.{md,csv,png}; return rows.

    With ``cfg.runs`` (run folders of ``runners.train`` / ``runners.plan``, or sweep folders
    holding them) nothing is trained: those runs' ``result.json`` files are compared.
    """
    runs = cfg.get("runs")
    if runs is not None and len(runs) == 0:  # it used to start the whole default suite
        raise ValueError(
            "evaluate: runs=[] names no run folder; give runs=[DIR,...] to compare finished "
            "runs, or leave runs out to train the suite (envs x agents x seeds)"
        )
    if runs:
        folders = run_folders(runs)
        rows = label_configs_apart(label_policies_apart([row_of_run(p) for p in folders]))
        check_one_problem_per_env(rows, folders)
        check_one_run_per_seed(rows, folders)
        notes = [f"left out, no result.json: {why}" for why in unfinished_runs(runs)]
        for note in notes:  # a sweep's crashed job was left out without a word (fuzzing)
            echo(f"evaluate: {note}")
        return _write_all(rows, run_dir, echo, notes)
    for group, names in (("env", cfg.envs), ("agent", cfg.agents)):
        unknown = sorted(set(names) - set(common.available(group)))
        if unknown:
            raise ValueError(
                f"evaluate: unknown {group}s {unknown}; available: {common.available(group)}"
            )
    check_suite(cfg)
    cells = [(e, a, int(s)) for e in cfg.envs for a in cfg.agents for s in cfg.seeds]
    configs = {}
    for env, agent, seed in cells:  # every cell checked before the first one trains
        configs[env, agent, seed] = sub = _compose_cell(cfg, env, agent, seed)
        try:
            schema.check_values(schema.TrainConfig, sub)
            check_config(sub)
            # a cell in use was found only when its turn came, the earlier cells' rows
            # lost with no results.md (fuzzing, 2 Dec 2026)
            folder_lock.check_free(run_dir / env / agent / f"s{seed}")
        except ValueError as exc:
            raise ValueError(f"evaluate: cell {env} x {agent} x seed {seed}: {exc}") from None
    rows: list[dict[str, Any]] = []
    for env in cfg.envs:
        for agent in cfg.agents:
            for seed in cfg.seeds:
                sub = configs[env, agent, int(seed)]
                cell = run_dir / env / agent / f"s{seed}"
                cell.mkdir(parents=True, exist_ok=True)
                # a cell is a train run's folder: held while it trains, as runners.train
                # holds its own (a runners.train in a cell folder was overwritten, fuzzing)
                with folder_lock.held(cell, "evaluate"):
                    res = train(sub, cell, echo=lambda s: None)
                row = {
                    "env": env,
                    "agent": agent,
                    "seed": int(seed),
                    "step_time_ms": _ms(res["best_step_time"]),
                    "lower_bound_ms": _ms(res["lower_bound"]),
                    "oom": bool(res["oom"]),
                    "oracle_calls": int(res["oracle_calls"]),
                    "wall_seconds": round(float(res["wall_seconds"]), 2),
                }
                rows.append(row)
                echo(
                    f"{env:<16} {agent:<13} seed {seed}: {row['step_time_ms']} ms "
                    f"({row['oracle_calls']} calls, {row['wall_seconds']:.1f} s)"
                )
    return _write_all(rows, run_dir, echo)


#: Keys the suite sets for each cell: an ``overrides`` entry for one of them used to replace
#: the cell's own (``overrides=['agent=metis']`` filed METIS's result under every agent).
CELL_KEYS = ("env", "agent", "seed", "output_dir", "resume", "logger", "run_baselines")


def check_suite(cfg: DictConfig) -> None:
    """Refuse an empty or repeated ``envs`` / ``agents`` / ``seeds`` (a repeated seed ran into
    the same folder and counted as another run; an empty list failed in matplotlib) and
    ``overrides`` that set what the suite sets per cell (:data:`CELL_KEYS`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    for key in ("envs", "agents", "seeds"):
        values = list(cfg[key])
        if not values:
            raise ValueError(f"evaluate: {key}=[] names nothing to run; give at least one")
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(
                f"evaluate: {key} repeats {repeated}; each cell runs once into its own folder"
            )
    for ov in cfg.overrides:
        try:
            (parsed,) = OverridesParser.create().parse_overrides([str(ov)])
        except (OverrideParseException, ValueError) as exc:
            raise ValueError(
                f"evaluate: overrides entry {ov!r} is not a hydra override: "
                f"{common.first_line(exc)}"
            ) from None
        full = parsed.key_or_group
        key = full if full in CELL_KEYS else full.split(".")[0]
        if full in CELL_KEYS or key == "train":
            what = "train.* budget (set it as train.KEY=... of evaluate)" if key == "train" else key
            raise ValueError(
                f"evaluate: overrides entry {ov!r} sets the {what}, which the suite sets for "
                f"each cell (envs x agents x seeds); the suite's own keys are {list(CELL_KEYS)} "
                "and train.*"
            )


def _compose_cell(cfg: DictConfig, env: str, agent: str, seed: int) -> DictConfig:
    """One cell's train config; a hydra error (a misspelt key inside ``overrides``) is a
    ``ValueError`` naming the cell (it was hydra's several-line message)."""
    try:
        return compose_train(cell_overrides(cfg, env, agent, seed))
    except Exception as exc:  # noqa: BLE001 - hydra's ConfigCompositionException & co.
        raise ValueError(
            f"evaluate: cell {env} x {agent} x seed {seed} (overrides {list(cfg.overrides)}): "
            f"{common.first_line(exc)}"
        ) from None


def run_folders(paths: Sequence[str]) -> list[Path]:
    """The run folders under ``paths``: each path is a run (it has ``result.json``) or a folder
    of runs (a sweep's ``multirun/.../N`` jobs), searched recursively; sorted, no repeats."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"runs: {p} does not exist")
        hits = (
            [p]
            if (p / "result.json").is_file()
            else sorted(
                r.parent
                for r in p.rglob("result.json")
                # not runners.train's .earlier_run/ (a killed command's; 3 Dec 2026: taken
                # as a run of its own)
                if not any(part.startswith(EARLIER_RUN) for part in r.parent.relative_to(p).parts)
            )
        )
        if not hits:
            holder = folder_lock.holder(p)
            aside = p / EARLIER_RUN / "result.json"
            raise ValueError(
                f"runs: {p} holds no result.json (a runners.train or runners.plan run)"
                + (f"; it is still running: {holder}" if holder else "")
                + (
                    f"; a runners.train command stopped before its first checkpoint (kill -9?) "
                    f"left the earlier run's in {aside.parent}: the next runners.train command "
                    "in the folder puts it back"
                    if aside.is_file() and not holder
                    else ""
                )
            )
        found += [h for h in hits if h not in found]
    return found


#: Files a ``runners.train`` / ``runners.plan`` run folder holds before its ``result.json``.
RUN_MARKERS = (
    "train.log",
    "plan.log",
    "error.txt",
    "checkpoint.pkl",
    "run_info.json",  # a runners.evaluate cell has no train.log (fuzzing)
    "wall_clock.json",
)


def unfinished_runs(paths: Sequence[str]) -> list[str]:
    """The run folders under ``paths`` (searched as :func:`run_folders` searches) that hold
    a run's log, ``error.txt`` or checkpoint but no ``result.json``: failed, killed or still
    running. Each as ``"FOLDER (why)"``, the first line of its ``error.txt`` where it has one."""
    out: list[str] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        for marker in RUN_MARKERS:
            for f in [p / marker, *p.rglob(marker)]:
                run = f.parent
                hidden = any(part.startswith(".") for part in run.relative_to(p).parts)
                if not f.is_file() or hidden or run in seen or (run / "result.json").is_file():
                    continue
                seen.add(run)
                err = run / "error.txt"
                why = "unfinished: killed or still running"
                holder = folder_lock.holder(run)
                if holder is not None:  # a runner holds it: running now, not killed
                    why = f"still running: {holder}"
                elif err.is_file():
                    first = err.read_text(errors="replace").strip().splitlines()
                    why = f"failed: {first[0][:200] if first else 'error.txt is empty'}"
                if holder is None and (run / EARLIER_RUN / "result.json").is_file():
                    why += (
                        f"; the earlier run's result is set aside in {EARLIER_RUN}/ until the "
                        "next runners.train command in the folder puts it back"
                    )
                out.append(f"{run} ({why})")
    return sorted(out)


def check_one_run_per_seed(rows: Sequence[dict[str, Any]], folders: Sequence[Path]) -> None:
    """A row's mean and std are over seeds: two runs of one (env, agent, seed) -- the same
    seed trained twice with other settings, or two runners.plan runs of one policy folder
    (plan runs count as seed 0) -- were averaged as if independent (found by fuzzing, 29 Nov
    2026)."""
    first: dict[tuple[str, str, int], Path] = {}
    for row, folder in zip(rows, folders):
        key = (row["env"], row["agent"], int(row["seed"]))
        if key in first:
            raise ValueError(
                f"runs: {first[key]} and {folder} are both env {key[0]!r}, agent {key[1]!r}, "
                f"seed {key[2]}: a row averages over seeds, so compare one run per seed "
                "(a runners.plan run is seed S of plan:POLICY_FOLDER, its seed=S; 0 for "
                "runs from before 4 Dec 2026)"
            )
        first[key] = folder


def check_one_problem_per_env(rows: Sequence[dict[str, Any]], folders: Sequence[Path]) -> None:
    """Runs are grouped by env name; two runs of one name but different problems (another
    ``env.cluster``, model or microbatches: another lower bound) used to be averaged into one
    row, under the first run's lower bound (found by fuzzing). Runs that record their
    ``problem`` (:func:`runners.common.problem_identity`) are compared by it, which also
    tells runs of another schedule or memory fraction apart (equal lower bounds)."""
    first: dict[str, tuple[float | None, Path, dict | None]] = {}
    for row, folder in zip(rows, folders):
        lb, prob = row["lower_bound_ms"], row.get("problem")
        if row["env"] not in first:
            first[row["env"]] = (lb, folder, prob)
            continue
        lb0, folder0, prob0 = first[row["env"]]
        # keys both runs record (env_id and hybrid_model since 2 Dec 2026: earlier runs
        # are compared on the rest)
        keys = sorted(set(prob or {}) & set(prob0 or {}))
        diff = ", ".join(f"{k} {prob0[k]!r} vs {prob[k]!r}" for k in keys if prob0[k] != prob[k])
        if diff:
            raise ValueError(
                f"runs: {folder0} and {folder} both ran env {row['env']!r} but on different "
                f"problems ({diff}); compare runs of one problem per env name"
            )
        if lb is not None and lb0 is not None and not math.isclose(lb, lb0, rel_tol=1e-6):
            raise ValueError(
                f"runs: {folder0} and {folder} both ran env {row['env']!r} but on different "
                f"problems (lower bounds {lb0:.4f} and {lb:.4f} ms: another cluster, model or "
                "pipeline setting); compare runs of one problem per env name"
            )


def policy_label(policy: str) -> str:
    """A ``runners.plan`` run's policy as its table row names it: the folder of the policy
    file (the training run's), or the shipped policy's name (``generalist``: it was named
    by its folder, ``plan:pretrained``, until 3 Dec 2026)."""
    path = Path(policy)
    shipped = path.parent.name == "pretrained" and path.parent.parent.name == "agents"
    if shipped or path.parent.name == "":  # this install's or another's (site-packages)
        return path.stem
    return path.parent.name


#: What a ``runners.plan`` run's ``result.json`` records of how it planned: runs of one
#: policy that differ in one of these are rows of their own (``plan:generalist[samples=16]``).
PLAN_SETTINGS = ("samples", "greedy", "decode", "penalty", "temperature", "link_exponent")

#: Keys of a run's ``config.yaml`` that do not make it another method: where it ran, how
#: it logged and checkpointed, and the seed (a row's mean is over seeds).
NOT_THE_METHOD = (
    "seed", "output_dir", "resume", "torch_threads", "logger.", "train.progress",
    "train.checkpoint_every", "train.crash_after_updates",
)  # fmt: skip


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def train_settings(run: Path) -> dict[str, Any] | None:
    """A ``runners.train`` run's ``config.yaml`` as dotted keys, without the keys that are
    not the method (:data:`NOT_THE_METHOD`); ``None`` without a readable one."""
    from omegaconf import OmegaConf

    try:
        flat = _flat(OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=False))
    except Exception:  # noqa: BLE001 - missing or not a config: the row keeps its label
        return None
    return {
        k: v for k, v in flat.items()
        if not any(k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_THE_METHOD)
    }  # fmt: skip


def label_configs_apart(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of one env and agent whose settings differ -- a ``runners.train`` sweep over
    ``agent.ppo.learning_rate``, ``train.timesteps`` or ``env.baselines`` (its
    ``config.yaml``, :func:`train_settings`), a ``runners.plan`` sweep over
    :data:`PLAN_SETTINGS` (``-m samples=16,1024``) -- get the differing settings in their
    label, ``placeto[agent.ppo.learning_rate=0.001]``: such a sweep's runs of one seed were
    refused as "two runs of one seed", and of different seeds averaged into one row (4 Dec
    2026). Keys an older run lacks are left out; runs without settings keep their label."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("settings") is not None:
            groups.setdefault((r["env"], r["agent"]), []).append(r)
    for members in groups.values():
        # keys every run records: a key added since an older run is not a difference
        keys = sorted(set.intersection(*(set(r["settings"]) for r in members)))
        differ = [k for k in keys if len({repr(r["settings"][k]) for r in members}) > 1]
        for r in members if differ else ():
            r["agent"] += "[" + ",".join(f"{k}={r['settings'][k]}" for k in differ) + "]"
    return rows


def row_of_run(run: Path) -> dict[str, Any]:
    """One table row from a ``runners.train`` or ``runners.plan`` run's ``result.json``, read
    strictly: a wrong type, a negative or non-finite figure is a ``ValueError`` naming the
    file and the field (a negative step time became a table row, a string a TypeError)."""
    from graphs.schema import Fields, read_json

    path = run / "result.json"
    f = Fields(path)
    res = f.obj(read_json(path), "", free=True)
    if "best_step_time" in res:  # runners.train
        f.obj(res, "", required=("env", "agent", "best_step_time"), free=True)
        agent = f.string(res["agent"], "agent")
        step_key, seed = "best_step_time", f.integer(res.get("seed", 0), "seed", lo=0)
        # a run started from a policy (agent.init_policy=generalist, since 4 Dec 2026) is
        # another method than the same agent from scratch: it was their row, averaged, or
        # on one seed refused as two runs of one seed
        meta = res.get("meta") if isinstance(res.get("meta"), dict) else {}
        policy, settings = None, train_settings(run)
        if meta.get("init_policy"):
            agent += f"+{policy_label(f.string(meta['init_policy'], 'meta.init_policy'))}"
            if "init_policy_sha256" in meta:
                policy = {"sha256": f.string(meta["init_policy_sha256"], "meta.init_policy_sha256")}
    elif "planning_seconds" in res:  # runners.plan
        f.obj(res, "", required=("env", "policy", "step_time"), free=True)
        agent = f"plan:{policy_label(f.string(res['policy'], 'policy'))}"
        # the plan's seed= (recorded since 4 Dec 2026; every plan run was seed 0 before)
        step_key, seed = "step_time", f.integer(res.get("seed", 0), "seed", lo=0)
        settings = {k: res[k] for k in PLAN_SETTINGS if k in res}
        # which weights planned (since 3 Dec 2026): two policies of one label told apart
        if "policy_sha256" in res:
            policy = {"sha256": f.string(res["policy_sha256"], "policy_sha256")}
        else:
            policy = {"file": res["policy"]}
    else:
        raise ValueError(f"{path}: neither a runners.train nor a runners.plan result")

    def seconds(key: str, *, positive: bool = False) -> float | None:
        v = res.get(key)
        return None if v is None else f.number(v, key, lo=0, lo_open=positive)

    step = seconds(step_key, positive=True)
    oom = f.boolean(res.get("oom", False), "oom")
    wall = seconds("wall_seconds") if "wall_seconds" in res else seconds("planning_seconds")
    return {
        "env": f.string(res["env"], "env"),
        "agent": agent,
        "seed": int(seed),
        "step_time_ms": None if oom else _ms(step),
        "lower_bound_ms": _ms(seconds("lower_bound")),
        "oom": oom,
        "oracle_calls": f.integer(res.get("oracle_calls", 0), "oracle_calls", lo=0),
        "wall_seconds": round(wall or 0.0, 2),
        # what was planned (graph, cluster, scoring); absent in runs from before 30 Nov 2026
        "problem": f.obj(res["problem"], "problem", free=True) if "problem" in res else None,
        "policy": policy,
        "settings": settings,
    }


def label_policies_apart(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one label planned by (``plan:FOLDER``, ``plan:generalist``) or started from
    (``ppo+FOLDER``, ``ppo+generalist``: ``agent.init_policy``) different weights -- two
    training runs whose folders share a name (``a/train``, ``b/train``), or the shipped
    policy of two releases -- get the label and the first 8 hex digits of their policy's
    SHA-256 (``plan:train@1a2b3c4d``; the policy file for plan runs from before 3 Dec 2026,
    which record no digest). They were one table row averaged over different policies, or,
    on one env, refused as "two runs of one seed" (4 Dec 2026). Rows of one policy keep the
    plain label."""
    seen: dict[str, set[tuple]] = {}
    for r in rows:
        if r.get("policy"):
            seen.setdefault(r["agent"], set()).add(tuple(sorted(r["policy"].items())))
    for r in rows:
        pol = r.get("policy")
        if pol and len(seen[r["agent"]]) > 1:
            r["agent"] += "@" + (pol["sha256"][:8] if "sha256" in pol else str(pol["file"]))
    return rows


def _write_all(
    rows: list[dict[str, Any]],
    run_dir: Path,
    echo: Callable[[str], None],
    notes: Sequence[str] = (),
) -> list[dict[str, Any]]:
    write_tables(rows, run_dir, notes)
    plot_bars(rows, run_dir / "results.png")
    echo(f"evaluate: {len(rows)} runs -> {run_dir / 'results.md'}")
    return rows


def _ms(seconds: float | None) -> float | None:
    """Milliseconds to 6 decimals: the table prints 2, as runners.train does; rounding to 3
    first printed 2.3048 ms as 2.31 where the run said 2.30."""
    return None if seconds is None or not math.isfinite(seconds) else round(seconds * 1e3, 6)


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std of the step time over seeds, per (env, agent), in first-seen order."""
    keys: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        keys.setdefault((r["env"], r["agent"]), []).append(r)
    out = []
    for (env, agent), rs in keys.items():
        ts = [r["step_time_ms"] for r in rs if r["step_time_ms"] is not None]
        out.append(
            {
                "env": env,
                "agent": agent,
                "runs": len(rs),
                "feasible": len(ts),
                "mean_ms": float(np.mean(ts)) if ts else None,
                "std_ms": float(np.std(ts)) if ts else None,
                "lower_bound_ms": rs[0]["lower_bound_ms"],
                "oracle_calls": float(np.mean([r["oracle_calls"] for r in rs])),
                "wall_seconds": float(np.mean([r["wall_seconds"] for r in rs])),
            }
        )
    return out


def write_tables(rows: Sequence[dict[str, Any]], run_dir: Path, notes: Sequence[str] = ()) -> None:
    """``results.csv`` (one row per run) and ``results.md`` (mean ± std over seeds; then
    ``notes``, one line each, e.g. the run folders left out)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS))
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r[k] is None else r[k]) for k in COLUMNS})
    common.write_bytes_atomic(run_dir / "results.csv", buf.getvalue().encode())

    lines = [
        "| env | agent | step time (ms) | lower bound (ms) | feasible runs | oracle calls | wall (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a in aggregate(rows):
        st = "no plan" if a["mean_ms"] is None else f"{a['mean_ms']:.2f} ± {a['std_ms']:.2f}"
        lb = "" if a["lower_bound_ms"] is None else f"{a['lower_bound_ms']:.2f}"
        lines.append(
            f"| {a['env']} | {a['agent']} | {st} | {lb} | {a['feasible']}/{a['runs']} | "
            f"{a['oracle_calls']:.0f} | {a['wall_seconds']:.1f} |"
        )
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    common.write_bytes_atomic(run_dir / "results.md", ("\n".join(lines) + "\n").encode())


def plot_bars(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per env, one bar per agent (mean step time, std as error bar, lower bound dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(rows)
    envs = list(dict.fromkeys(a["env"] for a in agg))
    fig, axes = plt.subplots(1, len(envs), figsize=(4.0 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        cells = [a for a in agg if a["env"] == env]
        x = np.arange(len(cells))
        means = [a["mean_ms"] if a["mean_ms"] is not None else 0.0 for a in cells]
        stds = [a["std_ms"] or 0.0 for a in cells]
        ax.bar(x, means, yerr=stds, color="tab:blue", capsize=3)
        for xi, a in zip(x, cells):
            if a["mean_ms"] is None:
                ax.text(xi, 0, "no plan", rotation=90, ha="center", va="bottom", fontsize=8)
        lb = cells[0]["lower_bound_ms"]
        if lb is not None:
            ax.axhline(lb, color="k", ls="--", lw=1, label="lower bound")
            ax.legend(fontsize=8)
        ax.set_xticks(x, [a["agent"] for a in cells], rotation=45, ha="right", fontsize=8)
        ax.set_title(env)
        ax.set_ylabel("step time (ms)")
    common.save_figure(fig, path, dpi=110)


@hydra.main(version_base=None, config_path="../conf", config_name="evaluate")
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = common.run_dir_from_hydra(cfg.get("output_dir"))
    saved, table = run_dir / "config.yaml", run_dir / "results.md"
    earlier = {p: p.read_bytes() if p.is_file() else None for p in (saved, table)}
    with common.reported_errors(run_dir, "evaluate"):
        try:
            common.write_bytes_atomic(saved, OmegaConf.to_yaml(cfg).encode())
            evaluate(cfg, run_dir, echo=common.RunLog(run_dir, "evaluate"))
        except BaseException:
            # a refused or failed command left its config.yaml beside the earlier command's
            # results.md (and so hydra's .hydra/ was not put back; fuzzing, 3 Dec 2026)
            now = table.read_bytes() if table.is_file() else None
            if now == earlier[table]:
                if earlier[saved] is None:
                    saved.unlink(missing_ok=True)
                else:
                    common.write_bytes_atomic(saved, earlier[saved])
            raise


def main() -> None:
    """Entry point: check the command-line keys against the schema, then run hydra."""
    schema.run_checked(schema.EvaluateConfig, _hydra_main)


if __name__ == "__main__":
    main()
