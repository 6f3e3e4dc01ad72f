"""devplace runtime: execute a Plan with torch.distributed (pipeline, op-level DAG, tensor parallel) and measure it."""

from runtime.dist import DistInfo, init_distributed, seed_everything, teardown
from runtime.execute import ExecResult, execute, execute_many, run_spec, run_specs
from runtime.launch import RankFailure, spawn
from runtime.model import RuntimeModel, load_model
from runtime.spec import RunSpec, make_run_spec, plan_hash

__all__ = [
    "DistInfo",
    "ExecResult",
    "RankFailure",
    "RunSpec",
    "RuntimeModel",
    "execute",
    "execute_many",
    "init_distributed",
    "load_model",
    "make_run_spec",
    "plan_hash",
    "run_spec",
    "run_specs",
    "seed_everything",
    "spawn",
    "teardown",
]
