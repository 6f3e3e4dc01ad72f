"""Fixtures shared by the layout tests."""

from __future__ import annotations

import pytest

from graphs import clusters, zoo


@pytest.fixture(scope="module")
def small():
    """A 1.3B GPT (24 layers) on two DGX A100 nodes: the per-stage layout tests' problem."""
    g = zoo.build("gpt", hidden=2048, layers=24, heads=16, vocab=51200, seq=2048, batch=64)
    return g, clusters.load("dgx_a100_80g", nodes=2)
