"""Metric loggers for the runners: wandb (offline by default), TensorBoard, or none."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KINDS = ("wandb", "tensorboard", "none")


class NullTracker:
    """Logs nothing; the runners' files (result.json, plots) are written regardless."""

    kind = "none"

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_image(self, key: str, path: str | Path, step: int | None = None) -> None:
        pass

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        pass

    def log_artifact(self, path: str | Path, name: str, type: str) -> None:
        pass

    def summary(self, values: Mapping[str, Any]) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbTracker(NullTracker):
    """Weights & Biases run. Mode: ``mode`` argument, else ``$WANDB_MODE``, else ``offline``.

    Offline runs land in ``RUN_DIR/wandb/offline-run-*``; upload them later with
    ``wandb sync RUN_DIR/wandb/offline-run-*``.
    """

    kind = "wandb"

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        *,
        name: str,
        project: str = "devplace",
        entity: str | None = None,
        mode: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        run_id: str | None = None,
    ) -> None:
        import wandb

        self._wandb = wandb
        mode = mode or os.environ.get("WANDB_MODE") or "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=project,
            entity=entity,
            mode=mode,
            group=group,
            tags=list(tags),
            name=name,
            dir=str(run_dir),
            config=dict(config),
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run.define_metric("placement/*", step_metric="timesteps")
        self.run.define_metric("reference/*", step_metric="timesteps")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({**metrics, "timesteps": step})

    def log_image(self, key: str, path: str | Path, step: int | None = None) -> None:
        self.run.log({key: self._wandb.Image(str(path))})

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.run.log({key: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])})

    def log_artifact(self, path: str | Path, name: str, type: str) -> None:
        art = self._wandb.Artifact(name, type=type)
        art.add_file(str(path))
        self.run.log_artifact(art)

    def summary(self, values: Mapping[str, Any]) -> None:
        for k, v in values.items():
            self.run.summary[k] = v

    def finish(self) -> None:
        self.run.finish()


class TensorBoardTracker(NullTracker):
    """TensorBoard event files under ``RUN_DIR/tb`` (``tensorboard --logdir outputs``)."""

    kind = "tensorboard"

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))
        import yaml

        self.writer.add_text("config", "```\n" + yaml.safe_dump(dict(config)) + "\n```")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_image(self, key: str, path: str | Path, step: int | None = None) -> None:
        import matplotlib.image as mpimg

        img = mpimg.imread(str(path))
        self.writer.add_image(key, img[..., :3], step or 0, dataformats="HWC")

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join("| " + " | ".join(str(c) for c in r) + " |\n" for r in rows)
        self.writer.add_text(key, head + body)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.writer.add_text("summary", "\n".join(f"{k}: {v}" for k, v in values.items()))

    def finish(self) -> None:
        self.writer.close()


def make_tracker(
    kind: str,
    run_dir: Path,
    config: Mapping[str, Any],
    *,
    name: str,
    options: Mapping[str, Any] | None = None,
) -> NullTracker:
    """The tracker of ``kind`` (one of :data:`KINDS`); ``options`` are the logger config's keys."""
    opts = dict(options or {})
    if kind == "wandb":
        return WandbTracker(
            run_dir,
            config,
            name=name,
            project=opts.get("project") or "devplace",
            entity=opts.get("entity"),
            mode=opts.get("mode"),
            group=opts.get("group"),
            tags=opts.get("tags") or (),
            run_id=opts.get("run_id"),
        )
    if kind == "tensorboard":
        return TensorBoardTracker(run_dir, config)
    if kind == "none":
        return NullTracker()
    raise ValueError(f"unknown logger kind {kind!r}; expected one of {KINDS}")
