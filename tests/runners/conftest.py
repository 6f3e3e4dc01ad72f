"""Fixtures of the runner tests: a small graph file and composed train configs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from omegaconf import DictConfig

from graphs import io as gio
from graphs.compgraph import CompGraph
from graphs.training import with_backward


def chain_graph(n: int = 8) -> CompGraph:
    """An ``n``-layer chain training graph (3n nodes) sized so 2 x K40 must split it."""
    fwd = CompGraph.build(
        n,
        [(i, i + 1) for i in range(n - 1)],
        flops=2e11,
        bytes_accessed=4e9,
        out_bytes=64e6,
        param_bytes=np.r_[4e9, np.full(n - 1, 1.5e9)],
        act_bytes=256e6,
        name=[f"layer{i}" for i in range(n)],
        meta={"name": f"chain{n}", "batch": 8, "bytes_per_param": 16},
    )
    return with_backward(fwd)


@pytest.fixture(scope="session", autouse=True)
def checkpoint_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Checkpoints of the tests are signed with a throwaway key, not the user's own."""
    import os

    from runners import checkpoint

    path = tmp_path_factory.mktemp("key") / "checkpoint.key"
    old = os.environ.get(checkpoint.KEY_ENV)
    os.environ[checkpoint.KEY_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(checkpoint.KEY_ENV, None)
    else:
        os.environ[checkpoint.KEY_ENV] = old


@pytest.fixture(scope="session")
def graph_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graphs") / "chain8.json"
    gio.save(chain_graph(), path)
    return path


def small_env(graph_file: Path) -> list[str]:
    """Overrides making a small problem: the chain graph on 2 x K40, one cheap baseline."""
    return [
        "+env=rnnlm_k40_2",
        f"env.graph_file={graph_file}",
        "env.model=null",
        "env.baselines=[single,expert]",
        "logger=none",
        "train.progress=false",
        "train.seconds=null",
    ]


def compose(overrides: Sequence[str], config: str = "train") -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from runners import common, schema

    schema.register()
    with initialize_config_dir(config_dir=str(common.CONF_DIR), version_base=None):
        return hydra_compose(config_name=config, overrides=list(overrides))


ROOT = Path(__file__).resolve().parents[2]


def run_cli_module(module: str, args: Sequence[str]) -> tuple[int | str | None, bool, str]:
    """Run ``python -m MODULE ARGS`` in a fresh interpreter (from the repository root) up to
    its ``SystemExit``; returns the exit code, whether torch was imported by then, and
    stderr (see :func:`run_cli_module_cases`)."""
    return run_cli_module_cases(module, [args], timeout=120)[0]


def run_cli_module_cases(
    module: str, cases: Sequence[Sequence[str]], timeout: int = 300
) -> list[tuple[int | str | None, bool, str]]:
    """Run ``python -m MODULE ARGS`` for each ``ARGS`` of ``cases`` in turn, in one fresh
    interpreter (from the repository root; hydra's global state cleared between them), each
    up to its ``SystemExit``; returns each one's exit code, whether torch was imported by its
    end (the first case's alone is its own) and what it wrote to stderr (an exception that
    escaped is its traceback, exit code ``"raised"``). For the commands that
    should be refused before any work: a process each cost seconds of imports apiece."""
    code = (
        "import contextlib, io, json, runpy, sys, traceback\n"
        "from hydra.core.global_hydra import GlobalHydra\n"
        f"out = []\nfor args in {[list(c) for c in cases]!r}:\n"
        f"    sys.argv = [{module!r}, *args]\n"
        "    err, code = io.StringIO(), None\n"
        "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        f"            runpy.run_module({module!r}, run_name='__main__')\n"
        "        except SystemExit as e:\n"
        "            code = e.code\n"
        "        except BaseException:\n"
        "            code = 'raised'\n"
        "            err.write(traceback.format_exc())\n"
        "    GlobalHydra.instance().clear()\n"
        "    out.append([code, 'torch' in sys.modules, err.getvalue()])\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [tuple(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]
