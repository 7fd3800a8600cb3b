"""strideguard: every output of an AOTInductor-compiled method comes back dense.

``inspect`` finds the outputs that would come back strided or aliased and says
why; ``densify_outputs`` and ``prepare_for_aoti`` fix the program before
compilation with the cheapest copies; ``verify`` compiles, runs and proves it.
"""

import logging as _logging
import os as _os
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("strideguard")
    """The installed package's version (``pyproject.toml``)."""
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

def _log_from_environment() -> None:
    """``STRIDEGUARD_LOG=info`` (or ``debug``, ``warning``) shows what strideguard decides, lowers and skips, on
    stderr; without it, strideguard's logger is left to the application (warnings reach stderr as usual)."""
    level = _os.environ.get("STRIDEGUARD_LOG", "").strip().upper()
    if not level:
        return
    logger = _logging.getLogger("strideguard")
    logger.setLevel(_logging.getLevelName(level) if isinstance(_logging.getLevelName(level), int) else _logging.INFO)
    if not logger.handlers:
        handler = _logging.StreamHandler()
        handler.setFormatter(_logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        logger.addHandler(handler)


_log_from_environment()

from .api import aoti_compile_and_package, densify_outputs, inspect, prepare_for_aoti
from .compiler.targets import LoweringUnavailable, Target
from .decide.view_conversion import ConversionPolicy, EXECUTORCH, NO_CONVERSION, STRIDEGUARD
from .program.reports import (
    Action,
    Alias,
    AliasKind,
    LayoutReport,
    OutputCheck,
    OutputKind,
    OutputLayout,
    Reason,
    VerifyReport,
)
from .prove.proof import LayoutNotReached, Proof
from .prove.verification import EAGER_TOLERANCES, PUSHDOWN_TOLERANCE, verify

__all__ = [
    "__version__",
    "EAGER_TOLERANCES",
    "EXECUTORCH",
    "NO_CONVERSION",
    "STRIDEGUARD",
    "Action",
    "ConversionPolicy",
    "Alias",
    "AliasKind",
    "LayoutNotReached",
    "LayoutReport",
    "LoweringUnavailable",
    "OutputCheck",
    "OutputKind",
    "OutputLayout",
    "PUSHDOWN_TOLERANCE",
    "Proof",
    "Reason",
    "Target",
    "VerifyReport",
    "aoti_compile_and_package",
    "densify_outputs",
    "inspect",
    "prepare_for_aoti",
    "verify",
]
