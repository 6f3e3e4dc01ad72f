"""Bad-input table of policy files (``agents.load_policy``).

Each row edits the payload of a valid exported policy (or replaces the file's bytes) and
must be refused with one ``ValueError`` naming the file, the field and the value, and
never with torch's advice to retry with ``weights_only=False``. Classes as in
``tests/graphs/test_bad_inputs.py``; a policy file has no JSON text, so "binary" there is
"foreign" here (not a torch zip, a truncated one, or one holding arbitrary objects).
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import placement_env  # noqa: F401  (registers the env ids)
from agents import export_policy, load_policy
from agents.ppo import make_ppo
from graphs.clusters import load
from graphs.compgraph import CompGraph
from graphs.schema import MAX_DEPTH, show
from placement_env.generators import fixed

CLASSES = (
    "wrong_type",
    "unknown_key",
    "empty",
    "duplicate",
    "out_of_range",
    "huge_int",
    "non_finite",
    "non_object",
    "nesting",
    "foreign",
    "missing",
)
MISSING = object()


class Evil:
    """Any class: unpickling it imports and runs code of the file's choosing."""


@dataclass(frozen=True)
class Bad:
    cls: str
    change: Callable[[dict], Any] | bytes | Callable[[bytes], bytes]
    field: str
    value: Any  # or value(valid_payload, valid_bytes); None: the field alone is named
    raw: bool = False  # change takes and returns the valid file's bytes

    def __str__(self) -> str:
        return f"{self.cls}-{self.field}"


def put(path: str, value: Any) -> Callable[[dict], Any]:
    def change(d: dict) -> dict:
        if path.startswith("state_dict."):  # weight names hold dots
            d["state_dict"][path[len("state_dict.") :]] = value
            return d
        *head, last = path.split(".")
        node = d
        for p in head:
            node = node[p]
        node[last] = value
        return d

    return change


def drop(path: str) -> Callable[[dict], Any]:
    def change(d: dict) -> dict:
        *head, last = path.split(".")
        node = d
        for p in head:
            node = node[p]
        del node[last]
        return d

    return change


def whole(value: Any) -> Callable[[dict], Any]:
    return lambda d: value


def nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


@pytest.fixture(scope="module")
def policy_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid exported policy (untrained: only its format matters here)."""
    graph = CompGraph.build(4, [(0, 1), (1, 2), (2, 3)], flops=1e9, out_bytes=1e6)
    model = make_ppo(
        "placement_env/Sweep-v0",
        "placeto",
        env_kwargs={"generator": fixed(graph, load("cpu_2"))},
        n_steps=16,
        net_kwargs={"hidden": 16},
        seed=0,
    )
    path = export_policy(model, tmp_path_factory.mktemp("pol") / "p.pt")
    return path.read_bytes()


def first_weight(d: dict) -> str:
    return next(iter(d["state_dict"]))


def with_weight(fn: Callable[[torch.Tensor], Any]) -> Callable[[dict], Any]:
    def change(d: dict) -> dict:
        k = first_weight(d)
        d["state_dict"][k] = fn(d["state_dict"][k])
        return d

    return change


W = "state_dict.{w}"  # the first weight's field; filled in by the test
NAN_W = with_weight(lambda t: t.clone().fill_(float("nan")))
FEATURE0 = "features.node[1]"

TABLE = [
    Bad("wrong_type", put("network", 3), "network", 3),
    Bad("wrong_type", put("mode", 5), "mode", 5),
    Bad("wrong_type", put("env_id", 7), "env_id", 7),
    Bad("wrong_type", put("version", "1"), "version", "1"),
    Bad("wrong_type", put("config.hidden", "16"), "config.hidden", "16"),
    Bad("wrong_type", put("config.hidden", 16.0), "config.hidden", 16.0),
    Bad("wrong_type", put("config.aggr", True), "config.aggr", True),
    Bad("wrong_type", with_weight(lambda t: t.tolist()), W, lambda g, b: g["state_dict"][first_weight(g)].tolist()),
    Bad("wrong_type", put("env_options.max_episode_steps", True), "env_options.max_episode_steps", True),
    Bad("wrong_type", put("features.node", "flops"), "features.node", "flops"),
    Bad("unknown_key", put("netwrok", "placeto"), "netwrok", "placeto"),
    Bad("unknown_key", put("env_options.hoizon", 8), "env_options.hoizon", 8),
    Bad("unknown_key", put("config.hiden", 16), "config.hiden", 16),
    Bad("unknown_key", put("state_dict.head.extra", torch.zeros(2)), "state_dict.head.extra", None),
    Bad("empty", put("state_dict", {}), "state_dict", {}),
    Bad("empty", put("network", ""), "network", ""),
    Bad("empty", put("features.node", []), "features.node", []),
    Bad("duplicate", lambda d: d["features"]["node"].__setitem__(1, d["features"]["node"][0]) or d, FEATURE0, lambda g, b: g["features"]["node"][0]),
    Bad("out_of_range", put("mode", "sideways"), "mode", "sideways"),
    Bad("out_of_range", put("network", "transformer"), "network", "transformer"),
    Bad("out_of_range", put("env_id", "placement_env/Nope-v0"), "env_id", "placement_env/Nope-v0"),
    Bad("out_of_range", put("version", 99), "version", 99),
    # options and env that the file's mode and env do not take (tracebacks at planning before)
    Bad("out_of_range", put("env_id", "placement_env/OneShot-v0"), "env_id", "placement_env/OneShot-v0"),
    Bad("out_of_range", put("mode", "flat"), "env_id", "placement_env/Sweep-v0"),
    Bad("out_of_range", put("env_options.oom_penalty", -1.0), "env_options.oom_penalty", -1.0),
    Bad("wrong_type", put("env_options.oom_penalty", "x"), "env_options.oom_penalty", "x"),
    Bad("wrong_type", put("env_options.accept", [1]), "env_options.accept", [1]),
    Bad("unknown_key", put("env_options.horizon", 8), "env_options.horizon", 8),
    Bad("out_of_range", put("format", "devplace.plan"), "format", "devplace.plan"),
    Bad("out_of_range", put("env_options.max_episode_steps", 0), "env_options.max_episode_steps", 0),
    Bad("out_of_range", put("config.num_layers", -1), "config.num_layers", -1),
    Bad("out_of_range", with_weight(lambda t: torch.zeros(3)), W, (3,)),
    # integer weights were truncated copies of the file's, half ones rounded: both loaded
    Bad("wrong_type", with_weight(lambda t: t.to(torch.int64)), W, None),
    Bad("wrong_type", with_weight(lambda t: t.half()), W, None),
    Bad("huge_int", put("config.hidden", 2**70), "config.hidden", 2**70),
    Bad("huge_int", put("env_options.max_episode_steps", 2**64), "env_options.max_episode_steps", 2**64),
    Bad("non_finite", NAN_W, W, float("nan")),
    Bad("non_finite", with_weight(lambda t: t.clone().fill_(float("inf"))), W, float("inf")),
    Bad("non_finite", put("meta.step_time", float("nan")), "meta.step_time", float("nan")),
    Bad("non_finite", put("env_options.oom_penalty", float("-inf")), "env_options.oom_penalty", float("-inf")),
    Bad("non_object", whole([1, 2]), "(top level)", [1, 2]),
    Bad("non_object", whole(torch.zeros(2)), "(top level)", lambda g, b: torch.zeros(2)),
    Bad("non_object", put("config", [16]), "config", [16]),
    Bad("non_object", put("env_options", "fast"), "env_options", "fast"),
    Bad("non_object", put("features", 3), "features", 3),
    Bad("nesting", put("meta.deep", nested(MAX_DEPTH + 8)), "meta.deep" + "[0]" * (MAX_DEPTH - 2), nested(10)),
    Bad("foreign", json.dumps({"format": "devplace.policy"}).encode(), "(top level)", b'{"format": "devplace.policy"}'[:24]),
    Bad("foreign", pickle.dumps({"format": "devplace.policy"}), "(top level)", pickle.dumps({"format": "devplace.policy"})[:24]),
    Bad("foreign", lambda b: b[: len(b) // 2], "(top level)", lambda g, b: b[:24], raw=True),
    Bad("foreign", whole({"format": "devplace.policy", "x": Evil()}), "Evil", "test_bad_inputs.Evil"),
    Bad("missing", drop("features"), "features", MISSING),
    Bad("missing", drop("state_dict"), "state_dict", MISSING),
    Bad("missing", drop("config.node_dim"), "config.node_dim", MISSING),
]  # fmt: skip


@pytest.mark.parametrize("bad", TABLE, ids=str)
def test_bad_policy_is_refused_naming_file_field_and_value(
    tmp_path: Path, policy_bytes: bytes, bad: Bad
) -> None:
    path = tmp_path / "bad.pt"
    good = torch.load(io.BytesIO(policy_bytes), weights_only=True)
    field = bad.field.replace("{w}", first_weight(good))
    if isinstance(bad.change, bytes):
        path.write_bytes(bad.change)
    elif bad.raw:
        path.write_bytes(bad.change(policy_bytes))
    else:
        torch.save(bad.change(good), path)
    with pytest.raises(ValueError) as info:
        load_policy(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    fresh = torch.load(io.BytesIO(policy_bytes), weights_only=True)
    value = bad.value(fresh, policy_bytes) if callable(bad.value) else bad.value
    if bad.field == "Evil":  # no field: the refused object is what the message names
        assert value in msg, msg
    else:
        assert repr(field) in msg, msg
        if value is MISSING:
            assert "missing" in msg, msg
        elif value is not None:
            assert show(value) in msg, msg
    assert "weights_only" not in msg and "Traceback" not in msg


def test_valid_policy_loads(tmp_path: Path, policy_bytes: bytes) -> None:
    path = tmp_path / "ok.pt"
    path.write_bytes(policy_bytes)
    assert load_policy(path).network == "placeto"


def test_every_class_is_covered() -> None:
    have = {b.cls for b in TABLE}
    assert set(CLASSES) <= have, set(CLASSES) - have
