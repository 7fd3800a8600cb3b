"""strideguard: every output of an AOTInductor-compiled method comes back dense.

``inspect`` finds the outputs that would come back strided or aliased and says
why; ``densify_outputs`` and ``prepare_for_aoti`` fix the program before
compilation with the cheapest copies; ``verify`` compiles, runs and proves it.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("strideguard")
    """The installed package's version (``pyproject.toml``)."""
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from .api import aoti_compile_and_package, densify_outputs, inspect, prepare_for_aoti
from .proof import LayoutNotReached, Proof
from .view_conversion import EXECUTORCH, NO_CONVERSION, STRIDEGUARD, ConversionPolicy
from .records import (
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
from .targets import LoweringUnavailable, Target
from .verification import EAGER_TOLERANCES, PUSHDOWN_TOLERANCE, verify

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
