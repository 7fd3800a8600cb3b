"""What each kind of text in a program may contain, by where torch puts it.

Every string of a serialized program ends up somewhere: pasted into Python
that torch generates and runs (names), into a Python or C++ string literal
(operator arguments, messages, weight names), evaluated (expressions,
guards), parsed as data, or nowhere. Each function here accepts the text one
place allows and raises ``Refused`` naming what is wrong.
"""

from __future__ import annotations

import json
import keyword
import re

from . import limits
from .errors import excerpt, Refused

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FQN = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_VERSION = re.compile(r"[0-9A-Za-z.+_\-<=]{1,64}")

DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "mps", "xpu"})


def _bounded(text: str, limit: int, what: str) -> None:
    if len(text) > limit:
        raise Refused(f"{what} {excerpt(text)} is longer than {limit} characters")


def identifier(text: str, what: str) -> str:
    """A name torch pastes into generated Python as a variable, parameter or keyword: ASCII, no keyword, no dunder."""
    _bounded(text, limits.MAX_NAME, what)
    if not _IDENTIFIER.fullmatch(text) or keyword.iskeyword(text) or text.startswith("__"):
        raise Refused(f"{what} {excerpt(text)} is not a plain Python identifier")
    return text


def qualified_name(text: str, what: str) -> str:
    """A weight, buffer or module path (``net.0.weight``): pasted into generated Python and C++ strings."""
    _bounded(text, limits.MAX_NAME, what)
    if not _FQN.fullmatch(text):
        raise Refused(f"{what} {excerpt(text)} is not a dotted name of letters, digits, '_' and '-'")
    return text


def module_path(text: str, what: str) -> str:
    """A module path in the call graph: the root module is ``""``."""
    return text if text == "" else qualified_name(text, what)


def dotted_name(text: str, what: str) -> str:
    """A Python type or attribute path such as ``torch.nn.modules.linear.Linear``, with no dunder part."""
    _bounded(text, limits.MAX_NAME, what)
    if not _DOTTED.fullmatch(text) or any(part.startswith("__") for part in text.split(".")):
        raise Refused(f"{what} {excerpt(text)} is not a dotted Python name")
    return text


def string_literal(text: str, what: str) -> str:
    """Text torch pastes between double quotes in generated C++ or Python (operator arguments, messages)."""
    _bounded(text, limits.MAX_TEXT, what)
    if not text.isprintable() or '"' in text or "\\" in text:
        raise Refused(f"{what} {excerpt(text)} contains a quote, backslash or control character")
    return text


def quoted_input(text: str, what: str) -> str:
    """A string input: torch pastes it between single quotes in a guard, inside a double-quoted message."""
    string_literal(text, what)
    if "'" in text:
        raise Refused(f"{what} {excerpt(text)} contains a quote, which torch would paste into a guard")
    return text


def data_text(text: str, what: str, *, limit: int = limits.MAX_METADATA_TEXT) -> str:
    """Text that stays data: bounded, and printable apart from line breaks and tabs."""
    _bounded(text, limit, what)
    if not text.replace("\n", "").replace("\t", "").isprintable():
        raise Refused(f"{what} {excerpt(text)} contains a control character")
    return text


def stack_trace(text: str, what: str = "a stack trace") -> str:
    """Inductor's kernel-profile mode pastes stack traces into a C++ raw string ``R"(...)"``."""
    data_text(text, what)
    if ')"' in text:
        raise Refused(f"{what} contains ')\"', which would end a C++ raw string")
    return text


def json_text(text: str, what: str) -> str:
    """Metadata torch parses with ``json.loads`` and keeps as data."""
    data_text(text, what)
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        raise Refused(f"{what} is not valid JSON") from None
    return text


def json_object(text: str, what: str) -> str:
    """``custom`` metadata: torch parses it with ``json.loads`` and uses it as a dictionary."""
    json_text(text, what)
    if not isinstance(json.loads(text), dict):
        raise Refused(f"{what} is not a JSON object, which torch reads it as")
    return text


_NODE_SOURCE_FIELDS = {"name": str, "target": str, "graph_id": int, "pass_name": str, "action": str}
_NODE_SOURCE_DEPTH = 64


def node_sources(text: str, what: str) -> str:
    """``from_node`` metadata: a list of the dictionaries ``NodeSource.to_dict`` writes (each with its own
    ``from_node`` list), which torch reads back recursively."""
    json_text(text, what)
    pending = [(json.loads(text), 0)]
    while pending:
        sources, depth = pending.pop()
        if sources is None and depth:
            continue
        if not isinstance(sources, list) or depth > _NODE_SOURCE_DEPTH:
            raise Refused(f"{what} is not a list of node sources at most {_NODE_SOURCE_DEPTH} deep, which torch reads it as")
        for source in sources:
            if not isinstance(source, dict) or not source.keys() <= {*_NODE_SOURCE_FIELDS, "from_node"}:
                raise Refused(f"{what} holds an entry that is not a node source")
            for field, kind in _NODE_SOURCE_FIELDS.items():
                if field in source and (type(source[field]) is not kind):
                    raise Refused(f"{what} holds a node source whose {field} is not {kind.__name__}")
            pending.append((source.get("from_node"), depth + 1))
    return text


def device_type(text: str, what: str = "a device") -> str:
    if text not in DEVICE_TYPES:
        raise Refused(f"{what} {excerpt(text)} is not one of {', '.join(sorted(DEVICE_TYPES))}")
    return text


def version(text: str, what: str = "the torch version") -> str:
    if not _VERSION.fullmatch(text):
        raise Refused(f"{what} {excerpt(text)} is not a version number")
    return text
