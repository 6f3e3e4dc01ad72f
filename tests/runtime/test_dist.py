"""init_distributed: precise errors for bad torchrun variables, idempotence, seed policy."""

from __future__ import annotations

import pytest
import torch

from runtime.dist import free_port, init_distributed, read_env, seed_everything, teardown

pytestmark = pytest.mark.timeout(60)


def _env(monkeypatch, **kv):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in kv.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize(
    "env, match",
    [
        ({"RANK": "0"}, "WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, r"WORLD_SIZE='two' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK=2 is out of range for WORLD_SIZE=2"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "70000"},
            "MASTER_PORT=70000 is not a TCP port",
        ),
    ],
)
def test_bad_environment_is_explained(monkeypatch, env, match):
    _env(monkeypatch, **env)
    with pytest.raises(RuntimeError, match=match):
        read_env()
    with pytest.raises(RuntimeError, match=match):
        init_distributed()


def test_single_process_gloo_and_second_call(monkeypatch):
    _env(
        monkeypatch,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    try:
        a = init_distributed()
        b = init_distributed()  # safe to call twice
        assert a == b
        assert (a.rank, a.world_size, a.backend, a.device.type) == (0, 1, "gloo", "cpu")
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        teardown()
    assert not torch.distributed.is_initialized()
    teardown()  # idempotent


def test_seed_policy_gives_identical_weights():
    seed_everything(7)
    a = torch.nn.Linear(4, 4).weight.detach().clone()
    seed_everything(7)
    b = torch.nn.Linear(4, 4).weight.detach().clone()
    assert torch.equal(a, b)
