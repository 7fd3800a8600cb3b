"""torch's own deprecation notices, silenced around strideguard's calls and nowhere else.

Calls into torch that strideguard makes on the user's behalf (copying a
program, importing Inductor, lowering, compiling) raise notices about torch's
own code: ``isinstance(treespec, LeafSpec)`` when a program's tree specs are
copied, ``torch.jit.script_method`` when Inductor is first imported. They say
nothing about the user's code, and up to three came with each call. The
filters apply for the duration of a call only (``warnings.catch_warnings``),
and only to those messages: anything else, and anything the user's own code
raises outside these calls, is shown as the user's filters say.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

TORCH_NOTICES = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    (DeprecationWarning, r"`torch\.jit\.script_method` is deprecated"),
)
"""(category, message pattern) of each notice torch raises about itself inside strideguard's calls."""

Function = TypeVar("Function", bound=Callable[..., Any])


def quietly(function: Function) -> Function:
    """``function`` with ``TORCH_NOTICES`` ignored while it runs."""

    @functools.wraps(function)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            for category, message in TORCH_NOTICES:
                warnings.filterwarnings("ignore", message=message, category=category)
            return function(*args, **kwargs)

    return quiet  # type: ignore[return-value]
