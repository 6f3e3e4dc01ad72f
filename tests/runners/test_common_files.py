"""runners.common's atomic writes give files the mode a plain open() would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runners import common


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_atomic_writes_follow_the_umask(umask, mask: int, mode: int, tmp_path: Path) -> None:
    umask(mask)
    common.write_json(tmp_path / "result.json", {"a": 1})
    common.write_bytes_atomic(tmp_path / "sub" / "config.yaml", b"x: 1\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    for f in (tmp_path / "result.json", tmp_path / "sub" / "config.yaml", plain):
        assert f.stat().st_mode & 0o777 == mode, f
    assert common.umask_mode() == 0o666 & ~mask
    assert os.umask(mask) == mask  # umask_mode() left the process's umask as it was
    # replacing a file keeps the rule (the old file's mode is not inherited either way)
    os.chmod(tmp_path / "result.json", 0o600)
    common.write_json(tmp_path / "result.json", {"a": 2})
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == mode


def test_the_graph_cache_follows_the_umask(umask, tmp_path: Path) -> None:
    from graphs import synthetic
    from graphs.zoo import cache

    umask(0o022)
    g = synthetic.layered_dag(6, 2, rng=0)
    cache.save_npz(g, tmp_path / "g.npz")
    assert (tmp_path / "g.npz").stat().st_mode & 0o777 == 0o644
    assert cache.load_npz(tmp_path / "g.npz").content_hash() == g.content_hash()
