"""Print constraints.txt: the exact installed version of every distribution that
``devplace[dev]`` requires, directly or not, except torch (``make constraints``)."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEADER = """\
# Exact versions of everything `make setup` installs besides torch (TORCH_SPEC pins it): the
# environment the tests and the figures in docs/ were last produced with (Python 3.11, CPU).
# `make setup CONSTRAINTS=` installs without them (the newest versions pyproject.toml allows).
# Regenerate after changing dependencies: make constraints (tests/test_constraints.py checks
# that every installed dependency is pinned here)."""

UNPINNED = {"torch"}  # the Makefile's TORCH_SPEC picks the build (CPU or CUDA)


def closure(root: str = "devplace", extras: tuple[str, ...] = ("dev",)) -> dict[str, str]:
    """``{canonical name: installed version}`` of every installed distribution ``root[extras]``
    requires, transitively (requirements whose markers do not hold here are left out)."""
    out: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    stack = [(metadata.distribution(root), extras)]
    while stack:
        dist, ex = stack.pop()
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in ("", *ex)
            ):
                continue
            try:
                dep = metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                continue
            key = (canonicalize_name(req.name), tuple(sorted(req.extras)))
            if key in seen:
                continue
            seen.add(key)
            out[key[0]] = dep.version
            stack.append((dep, tuple(req.extras)))
    return out


def main() -> None:
    print(HEADER)
    for name, version in sorted(closure().items()):
        if name not in UNPINNED:
            print(f"{name}=={version}")


if __name__ == "__main__":
    main()
