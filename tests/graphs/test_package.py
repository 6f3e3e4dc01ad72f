"""The names ``graphs.__all__`` advertises are what they say, on every access and in any order."""

import subprocess
import sys

import pytest

import graphs


@pytest.mark.parametrize("name", ["coarsen", "extract"])
def test_lazy_functions_stay_functions(name: str) -> None:
    first = getattr(graphs, name)
    module = __import__(f"graphs.{'coarsening' if name == 'coarsen' else 'extraction'}")
    assert module is graphs
    again = getattr(graphs, name)
    assert callable(first) and first is again
    assert first.__name__ == name and not isinstance(first, type(graphs))


def test_from_import_after_submodule_import_in_a_fresh_process() -> None:
    code = (
        "import graphs.coarsening, graphs.extraction\n"
        "from graphs import coarsen, extract\n"
        "from graphs import coarsen as c2, extract as e2\n"
        "import types\n"
        "assert not isinstance(coarsen, types.ModuleType) and coarsen is c2\n"
        "assert not isinstance(extract, types.ModuleType) and extract is e2\n"
        "print(coarsen.__module__, extract.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["graphs.coarsening", "graphs.extraction"]


def test_every_advertised_name_resolves() -> None:
    for name in graphs.__all__:
        assert getattr(graphs, name) is not None
