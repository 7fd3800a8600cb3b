"""Every bound the loader enforces before it allocates, loops or evaluates anything.

A hostile file must not be able to make strideguard work in proportion to a
number it declares rather than to its own size. These are the numbers; each
check names the bound it enforces when it refuses a file.
"""

MAX_MEMBERS = 100_000
"""Archive members (a program with that many weights would be refused; none seen comes close)."""
MAX_CENTRAL_DIRECTORY = 64 << 20
"""Bytes of the zip directory, read before any member."""
MAX_PROGRAM_JSON = 256 << 20
"""Bytes of ``models/model.json``; parsing takes several times this in memory."""
MAX_CONFIG_JSON = 64 << 20
"""Bytes of each weights or constants configuration."""
MAX_SMALL_MEMBER = 64
"""Bytes of ``archive_format``, ``archive_version``, ``byteorder`` and the like."""
MAX_EXTRA_FILE = 16 << 20
"""Bytes of each ``extra/`` file ``torch.export.save`` may carry."""
MAX_JSON_DEPTH = 256
"""Nesting of the program's JSON, control-flow subgraphs included."""

MAX_NAME = 1024
"""Characters of a value, argument, weight or module name."""
MAX_TEXT = 4096
"""Characters of an operator's string argument, a string input or a guard."""
MAX_METADATA_TEXT = 1 << 20
"""Characters of one node's stack trace or other metadata."""
MAX_EXPRESSION = 10_000
"""Characters of one symbolic-shape expression."""
MAX_BITS = 4096
"""Bits of any number an expression, a guard or a chain of symbolic-size operations can compute (an
integer's length, a float's exponent either way), with every input size taken as 64 bits and every float
input as 1,024: ``9**9**9**9``, ``Pow(s0, 10**9)``, ``Float('1e2000000000')`` or ``floor`` of a float
raised to a large power are refused, ``s0**2`` is not."""
MAX_EXPRESSION_DEPTH = 32
"""Bracket nesting of an expression or a guard; sympy evaluates nested functions recursively."""
MAX_TERMS = 4096
"""Terms an expression can expand to (``ShapeEnv.simplify`` expands products of sums): a product of sixty
two-term sums (2**60 terms) or ``Pow(Add(s0, ..., s9), 59)`` is refused, ``(s0 + 1) * (s1 + 1)`` is not."""
MAX_FLOAT_PRECISION = 4096
"""Bits of precision of a sympy ``Float``."""
MAX_SYMBOL_INDEX = 999_999
"""Index in a symbol name such as ``s77`` or ``u3``; torch counts up to an unbacked symbol's index at load."""
MAX_INT = (1 << 63) - 1
"""Magnitude of any integer in the program: sizes, strides, hints, ranges and arguments are int64 to torch."""

MAX_NODES = 10_000
"""Nodes of the program, its control-flow subgraphs included (placeholders and the output are not nodes
of the serialized graph). With ``MAX_EXPRESSIONS_TOTAL``, what ``inspect`` and ``fix`` read within 30 s
on 2 cores (torch's own reading and writing take most of it); a larger program you trust can be read
with ``torch.export.load`` and given to the Python API."""

MAX_EXPRESSIONS_TOTAL = 500_000
"""Characters of the program's distinct symbolic-shape expressions together (each also at most
``MAX_EXPRESSION``): torch parses each distinct one, at about 6 us a character. A dynamic-shape program
repeats a few: an 8-block attention model with dynamic batch and sequence holds 344 expressions of 16,601
characters, 5 of them distinct (284 characters)."""

MAX_DIMS = 64
"""Dimensions of any declared tensor: torch's CUDA kernels take at most 25 (``MAX_TENSORINFO_DIMS``) and
ExecuTorch's runtime 16; its CPU kernels more. Every size and stride sum over them is then short."""

MAX_TREE_NODES = 100_000
"""Containers and leaves in the example inputs or in an input or output tree spec."""
MAX_TREE_DEPTH = 64
"""Nesting of containers in the example inputs or a tree spec."""
