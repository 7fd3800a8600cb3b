"""Walk a program's JSON against torch's own schema dataclasses, by field, never by key name.

``torch/_export/serde/schema.py`` describes the serialized program as
dataclasses and unions; torch's ``_dict_to_dataclass`` turns the JSON into
them. This walker visits the JSON the same way, with the same type hints,
and is stricter: a key the schema does not have, a missing required field, a
value of the wrong JSON type, an integer beyond int64 or an enum value the
schema does not list is refused. Every string and every dictionary key is
handed to the rule registered for the schema field it sits in (for example
``(Node, "target")``); a text field without a rule is refused, so a schema
change in a later torch shows up as a refusal, never as an unchecked string.
After a dataclass or union is walked, its hook (if any) checks the facts that
span fields, such as a node's target against its arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Callable, Mapping, Optional

from torch._export.serde import schema
from torch._export.serde.union import _Union

from . import limits
from .errors import excerpt, Refused

_FLOAT_WORDS = ("Infinity", "-Infinity", "NaN")
"""How torch's serializer writes floats JSON has no number for; ``float()`` reads them back."""

Field = tuple[type, str]
"""A schema field: its dataclass and its name, e.g. ``(schema.Node, "target")``."""
TextRule = Callable[[str, Optional[str]], None]
"""Checks one string: the text, and for a dictionary value, its key."""
Hook = Callable[[dict, str], None]
"""Checks a walked dataclass or union value (its JSON dict) at a path."""

@dataclasses.dataclass
class Rules:
    """What to check where: rules for string values and for dictionary keys, by field; hooks by class."""

    text: Mapping[Field, TextRule]
    keys: Mapping[Field, TextRule]
    hooks: Mapping[type, Hook] = dataclasses.field(default_factory=dict)


def walk(value: Any, cls: type, rules: Rules, path: str = "") -> None:
    """Refuse ``value`` unless it is a well-formed JSON form of the schema class ``cls``, and run every rule on it."""
    _Walker(rules).dataclass(value, cls, path or cls.__name__, 0)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(schema))


def _required(cls: type) -> frozenset[str]:
    return frozenset(
        field.name
        for field in dataclasses.fields(cls)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    )


def text_fields(cls: type) -> set[tuple[type, str, str]]:
    """Every place a string can sit in ``cls`` and what it reaches: ``(owner, field, "value" | "key")``.

    Used to prove that every text field has a rule.
    """
    found: set[tuple[type, str, str]] = set()
    seen: set[type] = set()

    def visit_type(hint: Any, owner: type, name: str) -> None:
        origin, arguments = typing.get_origin(hint), typing.get_args(hint)
        if hint is str:
            found.add((owner, name, "value"))
        elif origin is list:
            visit_type(arguments[0], owner, name)
        elif origin is dict:
            found.add((owner, name, "key"))
            visit_type(arguments[1], owner, name)
        elif origin in (typing.Union, types.UnionType):
            for argument in arguments:
                visit_type(argument, owner, name)
        elif dataclasses.is_dataclass(hint):
            visit_class(hint)

    def visit_class(owner: type) -> None:
        if owner in seen:
            return
        seen.add(owner)
        for name, hint in _hints(owner).items():
            visit_type(hint, owner, name)

    visit_class(cls)
    return found


class _Walker:
    def __init__(self, rules: Rules):
        self.rules = rules

    def value(self, value: Any, hint: Any, field: Field, path: str, depth: int, key: Optional[str] = None) -> None:
        if depth > limits.MAX_JSON_DEPTH:
            raise Refused(f"nests deeper than {limits.MAX_JSON_DEPTH} levels at {path}")
        origin, arguments = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            options = [argument for argument in arguments if argument is not type(None)]
            if value is None and len(options) < len(arguments):
                return
            if len(options) != 1:
                raise Refused(f"has an unexpected value at {path}")
            self.value(value, options[0], field, path, depth, key)
        elif origin is list:
            self.expect(value, list, path)
            for index, item in enumerate(value):
                self.value(item, arguments[0], field, f"{path}[{index}]", depth + 1)
        elif origin is dict:
            self.expect(value, dict, path)
            for item_key, item in value.items():
                self.key(item_key, field, path)
                self.value(item, arguments[1], field, f"{path}[{excerpt(item_key, 40)}]", depth + 1, item_key)
        elif hint is str:
            if not isinstance(value, str):
                raise Refused(f"has a {type(value).__name__} where text belongs at {path}")
            self.text(value, field, path, key)
        elif isinstance(hint, type) and issubclass(hint, enum.IntEnum):
            if type(value) is not int or value not in {member.value for member in hint}:
                raise Refused(f"has {excerpt(repr(value), 20)} at {path}, not a {hint.__name__} torch knows")
        elif hint is bool:
            self.expect(value, bool, path)
        elif hint is int:
            if type(value) is not int or abs(value) > limits.MAX_INT:
                raise Refused(f"has {excerpt(repr(value), 30)} at {path}, not a 64-bit integer")
        elif hint is float:
            if value in _FLOAT_WORDS:
                return
            if type(value) not in (int, float) or (type(value) is int and abs(value) > limits.MAX_INT):
                raise Refused(f"has {excerpt(repr(value), 30)} at {path}, not a number")
        elif isinstance(hint, type) and issubclass(hint, _Union):
            self.union(value, hint, path, depth)
        elif dataclasses.is_dataclass(hint):
            self.dataclass(value, hint, path, depth)
        else:
            raise Refused(f"has a field of a kind strideguard does not know at {path}")

    def dataclass(self, value: Any, cls: type, path: str, depth: int) -> None:
        self.expect(value, dict, path)
        hints = _hints(cls)
        unknown = [key for key in value if key not in hints]
        if unknown:
            raise Refused(f"has a field {excerpt(str(unknown[0]), 40)} at {path}, which torch's {cls.__name__} does not have")
        missing = sorted(_required(cls) - value.keys())
        if missing:
            raise Refused(f"lacks the field {missing[0]!r} of {cls.__name__} at {path}")
        for name, item in value.items():
            self.value(item, hints[name], (cls, name), f"{path}.{name}", depth + 1)
        self.hook(cls, value, path)

    def union(self, value: Any, cls: type, path: str, depth: int) -> None:
        self.expect(value, dict, path)
        hints = _hints(cls)
        if len(value) != 1 or next(iter(value)) not in hints:
            raise Refused(f"has a {cls.__name__} at {path} that is not exactly one of its kinds")
        [(name, item)] = value.items()
        self.value(item, hints[name], (cls, name), f"{path}.{name}", depth + 1)
        self.hook(cls, value, path)

    def hook(self, cls: type, value: dict, path: str) -> None:
        hook = self.rules.hooks.get(cls)
        if hook is not None:
            hook(value, path)

    def text(self, text: str, field: Field, path: str, key: Optional[str]) -> None:
        self.check(self.rules.text, "text", text, key, field, path)

    def key(self, key: Any, field: Field, path: str) -> None:
        if not isinstance(key, str):
            raise Refused(f"has a key that is not text at {path}")
        self.check(self.rules.keys, "a key", key, None, field, path)

    @staticmethod
    def check(rules: Mapping[Field, TextRule], what: str, text: str, key: Optional[str], field: Field, path: str) -> None:
        """Run the rule for ``field`` on ``text``; a field without a rule takes no text at all."""
        rule = rules.get(field)
        if rule is None:
            raise Refused(f"has {what} at {path}, where strideguard accepts none")
        try:
            rule(text, key)
        except Refused as refusal:
            raise Refused(f"{refusal} (at {path})") from None

    @staticmethod
    def expect(value: Any, kind: type, path: str) -> None:
        if type(value) is not kind:
            raise Refused(f"has a {type(value).__name__} at {path} where torch's schema has a {kind.__name__}")
