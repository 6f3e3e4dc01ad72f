"""constraints.txt pins the whole installed dependency closure, and `make setup` uses it."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _constraints_module():
    spec = importlib.util.spec_from_file_location("ci_constraints", ROOT / ".ci" / "constraints.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in line, f"constraints.txt: not an exact pin: {line!r}"
        key = canonicalize_name(name)
        assert key not in pins, f"constraints.txt pins {name} twice"
        pins[key] = version
    return pins


def test_every_installed_dependency_is_pinned_except_torch():
    mod = _constraints_module()
    deps = mod.closure()
    # the direct dependencies are found (the closure walks pyproject's requirements)
    for direct in ("numpy", "numba", "highspy", "stable-baselines3", "hypothesis", "torch"):
        assert direct in deps
    pins = _pins()
    missing = sorted(set(deps) - set(pins) - mod.UNPINNED)
    assert not missing, (
        f"installed but not pinned in constraints.txt (run make constraints): {missing}"
    )
    assert "torch" not in pins  # TORCH_SPEC picks the build


def test_an_environment_made_by_make_setup_has_the_pinned_versions():
    # `make setup` records which constraints it installed with in the venv
    used = Path(sys.prefix) / "constraints-used"
    if not used.exists() or used.read_text().strip() != "constraints.txt":
        pytest.skip("this environment was not installed by `make setup` with constraints.txt")
    mod = _constraints_module()
    deps = mod.closure()
    wrong = {n: (deps[n], v) for n, v in _pins().items() if n in deps and deps[n] != v}
    assert not wrong, f"installed (version, pin) differ: {wrong}"
    # so `make constraints` writes exactly this file again
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        mod.main()
    assert out.getvalue() == (ROOT / "constraints.txt").read_text()
