"""Strict readers for the files the project reads: each refusal is one ``ValueError`` naming the
file, the field (its path inside the file, e.g. ``nodes.flops[2]``) and the value.

The checks are deliberately narrow: ``true`` is not a number, ``2.0`` is not an integer,
``"3"`` is neither, an unknown key is an error (a typo would otherwise fall back to a
default without a word) except under documented extension fields such as ``meta``,
integers must fit the array they land in, numbers must be finite, and no value may nest
deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import gzip
import json
import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

#: Deepest nesting of objects/lists any project file may have (``meta`` included).
MAX_DEPTH = 32
#: Integers of the files land in int64 arrays.
INT64_MAX = 2**63 - 1
#: How many characters of a refused value a message shows.
_SHOW = 80

_MISSING = object()


def is_whole(value: Any, lo: int | None = None, *, floats: bool = False) -> bool:
    """An integer (a numpy one too, never a bool) ``>= lo``; with ``floats`` also an integral
    float such as ``2.0``. The one test of "a whole number" for options checked outside a file
    (a file's fields go through :meth:`Fields.integer`)."""
    if isinstance(value, bool):
        return False
    if not isinstance(value, numbers.Integral):
        whole_float = floats and isinstance(value, numbers.Real) and math.isfinite(value)
        if not (whole_float and float(value).is_integer()):
            return False
    return lo is None or value >= lo


def is_number(value: Any, lo: float | None = None, *, lo_open: bool = False) -> bool:
    """A finite real number (never a bool) ``>= lo`` (``> lo`` with ``lo_open``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    return lo is None or (value > lo if lo_open else value >= lo)


def show(value: Any) -> str:
    """``repr`` of a refused value, shortened for a one-line message."""
    if value is _MISSING:
        return "missing"
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 5] + " ...)"


def type_name(value: Any) -> str:
    """The JSON name of a value's type (``object``, ``list``, ``string``, ...)."""
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return type(value).__name__


class Fields:
    """Typed field checks of one file: ``Fields(source).integer(v, "nodes.kind[3]", lo=0, hi=2)``.

    Every check returns the value (converted where said) or raises
    ``ValueError("<source>: field '<path>' is <value>; expected <what>")``.
    """

    def __init__(self, source: str | Path) -> None:
        self.source = str(source)

    # ------------------------------------------------------------------ errors
    def error(self, path: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{self.source}: field {path!r} is {show(value)}; expected {expected}")

    def fail(self, path: str, message: str) -> ValueError:
        """A refusal whose message is not of the ``is VALUE; expected`` form."""
        return ValueError(f"{self.source}: field {path!r} {message}")

    # ----------------------------------------------------------------- objects
    def obj(
        self,
        value: Any,
        path: str,
        *,
        required: Iterable[str] = (),
        optional: Iterable[str] = (),
        free: bool = False,
    ) -> Mapping[str, Any]:
        """An object holding every ``required`` key and no key outside ``required | optional``
        (any key when ``free``); keys must be strings."""
        if not isinstance(value, Mapping):
            raise self.error(path or "(top level)", value, "an object")
        required, optional = tuple(required), tuple(optional)
        for k in value:
            if not isinstance(k, str):
                raise self.error(_join(path, str(k)), k, "string keys")
        if not free:
            known = set(required) | set(optional)
            unknown = sorted(set(value) - known)
            if unknown:
                k = unknown[0]
                raise self.fail(
                    _join(path, k),
                    f"is not a known key (value {show(value[k])}); valid keys here: {sorted(known)}",
                )
        for k in required:
            if k not in value:
                raise self.fail(_join(path, k), "is missing")
        return value

    # ------------------------------------------------------------------ scalars
    def integer(
        self, value: Any, path: str, *, lo: int | None = None, hi: int | None = None
    ) -> int:
        """An integer (not a boolean, not ``2.0``) in ``[lo, hi]`` (int64 range by default)."""
        lo_ = -INT64_MAX - 1 if lo is None else lo
        hi_ = INT64_MAX if hi is None else hi
        if not (isinstance(value, int) and not isinstance(value, bool)) or not lo_ <= value <= hi_:
            raise self.error(path, value, _int_range(lo, hi))
        return value

    def number(
        self,
        value: Any,
        path: str,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        allow_inf: bool = False,
    ) -> float:
        """A finite number (not a boolean; ``+inf`` too when ``allow_inf``) in range; a float."""
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        x = math.nan
        if ok:
            try:
                x = float(value)
            except OverflowError:
                ok = False
        if ok:
            ok = math.isfinite(x) or (allow_inf and x == math.inf)
        if ok and lo is not None:
            ok = x > lo if lo_open else x >= lo
        if ok and hi is not None:
            ok = x <= hi
        if not ok:
            raise self.error(path, value, _num_range(lo, hi, lo_open, allow_inf))
        return x

    def string(self, value: Any, path: str, *, choices: Iterable[str] | None = None) -> str:
        """A non-empty string (one of ``choices`` when given)."""
        if choices is not None:
            choices = tuple(choices)
            if not isinstance(value, str) or value not in choices:
                raise self.error(path, value, f"one of {list(choices)}")
            return value
        if not isinstance(value, str) or not value:
            raise self.error(path, value, "a non-empty string")
        return value

    def text(self, value: Any, path: str) -> str:
        """Any string, empty included."""
        if not isinstance(value, str):
            raise self.error(path, value, "a string")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(path, value, "true or false")
        return value

    # -------------------------------------------------------------------- lists
    def array(
        self,
        value: Any,
        path: str,
        item: Callable[[Any, str], Any],
        *,
        length: int | None = None,
        what: str = "items",
        nonempty: bool = False,
    ) -> list[Any]:
        """A list whose every element passes ``item(element, "path[i]")``."""
        if not isinstance(value, list):
            raise self.error(path, value, f"a list of {what}")
        if length is not None and len(value) != length:
            raise self.fail(path, f"has length {len(value)}, expected {length}")
        if nonempty and not value:
            raise self.error(path, value, f"a non-empty list of {what}")
        return [item(x, f"{path}[{i}]") for i, x in enumerate(value)]

    def unique(self, names: list[str], path: str, key: str = "") -> None:
        """Refuse a repeated name in ``names``, item ``i`` being at ``{path}[i]{key}``
        (``unique(names, "devices", ".name")`` names ``devices[3].name``)."""
        seen: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in seen:
                raise self.fail(
                    f"{path}[{i}]{key}",
                    f"is {show(name)}, already used by {path}[{seen[name]}]{key}",
                )
            seen[name] = i

    def depth(
        self, value: Any, path: str = "", limit: int = MAX_DEPTH, *, allow_inf: bool = False
    ) -> None:
        """Refuse objects/lists nested deeper than ``limit`` and NaN / infinite numbers
        anywhere (``+inf`` too unless ``allow_inf``: a field check then decides), checked
        without recursion."""
        stack: list[tuple[Any, str, int]] = [(value, path, 0)]
        while stack:
            v, p, d = stack.pop()
            if isinstance(v, float) and not math.isfinite(v):
                if math.isnan(v) or v < 0 or not allow_inf:
                    raise self.error(p or "(top level)", v, "a finite number")
                continue
            if isinstance(v, Mapping):
                items: Iterable[tuple[str, Any]] = ((_join(p, str(k)), x) for k, x in v.items())
            elif isinstance(v, list):
                items = ((f"{p}[{i}]", x) for i, x in enumerate(v))
            else:
                continue
            if d >= limit:
                raise self.fail(
                    p or "(top level)",
                    f"is {show(v)}, nested {limit} levels deep; expected at most {limit} levels",
                )
            stack.extend((x, q, d + 1) for q, x in items)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _int_range(lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return "an integer (64-bit)"
    if hi is None:
        return f"an integer >= {lo}" + (" (64-bit)" if lo is not None and lo < 2**62 else "")
    if lo is None:
        return f"an integer <= {hi}"
    return f"an integer in [{lo}, {hi}]"


def _num_range(lo: float | None, hi: float | None, lo_open: bool, allow_inf: bool) -> str:
    out = "a finite number" if not allow_inf else 'a number (or "inf")'
    if lo is not None:
        out += f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        out += f"{' and' if lo is not None else ''} <= {hi:g}"
    return out


# ======================================================================== files
def _constant(name: str) -> float:
    """``NaN`` / ``Infinity`` (not JSON, but Python writes them): read as floats so that the
    field check refuses them by name."""
    return float(name.replace("Infinity", "inf"))


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(
                f"key {k!r} appears twice in one object (values {show(out[k])} and {show(v)}); "
                "a reader would silently keep only the last"
            )
        out[k] = v
    return out


def check_path(path: Any, what: str = "path", expected: str = "a file path") -> Path:
    """``path`` as a :class:`~pathlib.Path`; a value that is not a file path (``None``, a
    number, bytes, ...) raises a ``TypeError`` naming ``what`` and the value, where
    ``open(5)`` would read file descriptor 5 and ``Path(None)`` says only "expected str"."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{what} is {show(path)} ({type(path).__name__}); expected {expected} "
            "(str or os.PathLike)"
        )
    return Path(path)


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, gunzipped when it ends in ``.gz``; ``ValueError`` naming the file."""
    path = check_path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read file ({exc.strerror})") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: not a valid gzip file ({exc})") from None
    return raw


def read_text(path: str | Path) -> str:
    """The file as UTF-8 text; a binary file (a pickle, a torch file) is refused by name."""
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: field '(top level)' is binary data (byte {exc.start} is "
            f"{raw[exc.start : exc.start + 1]!r}, not UTF-8 text: {show(raw[:24])}); expected "
            "JSON/YAML text, not a binary file such as a pickle"
        ) from None


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less this process's umask: the mode ``open()`` would give a new file.

    ``tempfile.mkstemp`` creates its file with mode 0600 whatever the umask, so a file
    published by renaming it would be readable by its owner only (a run folder on a shared
    cluster that the group cannot read)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mode & ~mask


def read_json(path: str | Path) -> Any:
    """Parse a (possibly gzipped) JSON file strictly: no ``NaN``/``Infinity`` (nor ``1e400``,
    which reads as infinity), no repeated key in one object, no nesting deeper than
    :data:`MAX_DEPTH`; each refused naming the field and the value."""
    text = read_text(path)
    try:
        data = json.loads(text, parse_constant=_constant, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise ValueError(f"{path}: {exc}") from None
    except RecursionError:
        raise _too_deep(path, text) from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    Fields(path).depth(data)
    return data


def _too_deep(path: str | Path, text: str) -> ValueError:
    return ValueError(
        f"{path}: field '(top level)' is {show(text[:40])}, nested deeper than the parser "
        f"can go; expected at most {MAX_DEPTH} levels"
    )


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML (or JSON) file safely: no repeated key in one mapping, no aliases
    (``*ref``: they let a few bytes expand into huge values), bounded nesting."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    first, line = seen[key]
                    raise ValueError(
                        f"key {key!r} appears twice in one mapping (lines {line + 1} and "
                        f"{key_node.start_mark.line + 1}, values {show(first)} and "
                        f"{show(getattr(value_node, 'value', '?'))}); a reader would silently "
                        "keep only the last"
                    )
                seen[key] = (getattr(value_node, "value", "?"), key_node.start_mark.line)
            return super().construct_mapping(node, deep=deep)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ValueError(
                    f"line {event.start_mark.line + 1}: YAML alias *{event.anchor} is not "
                    "allowed; write the value out"
                )
            return super().compose_node(parent, index)

    text = read_text(path)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML/JSON ({exc})") from None
    except RecursionError:
        raise _too_deep(path, text) from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    Fields(path).depth(data, allow_inf=True)  # memory: .inf is unbounded
    return data


__all__ = [
    "MAX_DEPTH",
    "Fields",
    "check_path",
    "read_bytes",
    "read_json",
    "read_text",
    "read_yaml",
    "show",
]
