"""The ``strideguard`` command line: a thin layer over the library.

Exit codes: 0 when every user output comes back dense in its target layout
(for ``verify``: measured so, with values equal to eager); 1 when some does
not; 3 (``inspect`` and ``fix``) when none is out of layout but some is
undecided, its layout decided by Inductor or the device; 2 when the command could not do its job: bad usage, a file it cannot or
will not read or write, or an error while fixing or compiling; 128 plus the
signal number when SIGINT, SIGTERM or SIGHUP stopped it (130, 143, 129). An
error is one line on stderr (with ``--json``, also ``{"ok": false, "error":
...}`` on stdout); ``--debug`` adds the traceback and torch's warnings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from enum import Enum
from pathlib import Path
from typing import Annotated, Iterator, Optional

import torch
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

try:  # typer 0.2x carries its own copy of click; earlier versions use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions

from . import __version__, densify_outputs, inspect, prepare_for_aoti
from .api import compile_proven
from .files import (
    check_output_path,
    Interrupted,
    interruptible,
    load_program,
    ProgramFileError,
    save_program,
    write_output,
)
from .files.errors import one_line
from .program.reports import counted, LayoutReport, shortened_pushdown, VerifyReport
from .prove.isolation import ChildFailed, DEFAULT_SECONDS, LimitExceeded, Limits, run_isolated
from .prove.proof import Proof, PROOF_KEY
from .prove.verification import reference_difference, verify as verify_program
from .tables import (
    BLOCKS, layout_shapes, literal, NARROW, plain_console, print_fitted, shown_source, SOURCE_LINE_SHOWN, verify_shapes,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    help="strideguard: outputs of AOTInductor-compiled methods, dense in the layout promised.",
)


def _show_version(requested: bool) -> None:
    if requested:
        typer.echo(f"strideguard {__version__} (torch {torch.__version__})")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", help="Show strideguard's and torch's versions and exit.", callback=_show_version, is_eager=True, metavar=""),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option("-v", "--verbose", help="Log on stderr what strideguard decides, lowers and skips, and why.", metavar=""),
    ] = False,
) -> None:
    """strideguard: outputs of AOTInductor-compiled methods, dense in the layout promised."""
    if verbose:
        logger = logging.getLogger("strideguard")
        logger.setLevel(logging.INFO)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("strideguard: %(message)s"))
        logger.addHandler(handler)


class Platform(str, Enum):
    """What ``fix`` prepares the program for."""

    aoti = "aoti"
    executorch = "executorch"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


ProgramFile = Annotated[
    Path, typer.Argument(help="A .pt2 file written by torch.export.save.", show_default=False, metavar="PROGRAM")
]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout and nothing else.", metavar="")]
Exact = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Ask Inductor: run its lowering (up to a quarter of a compile; no code is compiled), decide every "
        "output by it, and for fix lower the fixed program again until every output is proven in layout.",
        metavar="",
    ),
]
Wide = Annotated[
    bool,
    typer.Option("--wide", help="Print the whole table, every column, however narrow the terminal.", metavar=""),
]
LayoutOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--layout",
        help="NAME=LAYOUT: the layout output NAME (or index) must come back in: contiguous, channels_last, "
        "channels_last_3d, a dim order such as 0,2,3,1, or keep (as the compiler lays it out). Repeatable.",
        show_default=False,
    ),
]
Debug = Annotated[bool, typer.Option("--debug", help="On errors, show the traceback; show torch's warnings.", metavar="")]
TargetDevice = Annotated[
    Optional[str],
    typer.Option(
        "--device",
        help="The device the program is compiled for: cpu, cuda (sm90 assumed without a GPU), cuda:sm87, ... "
        "With --exact, Inductor's lowering for it runs here, on fake tensors where the device is not. "
        "Default: the device of the program's tensors.",
        show_default=False,
    ),
]

CompileDevice = Annotated[
    Optional[str],
    typer.Option(
        "--device",
        help="The device to compile for: cpu, cuda, cuda:sm87, ... It must be the device of the program's tensors, "
        "on this machine (AOTInductor compiles natively); elsewhere, use fix --exact --device. "
        "Default: the device of the program's tensors.",
        show_default=False,
    ),
]


@contextlib.contextmanager
def _running(action: str, debug: bool, json_output: bool = False) -> Iterator[None]:
    """Run library work quietly, with anything it prints kept off stdout, and turn failures into exit 2.

    stdout carries only the command's result (``--json`` promises nothing
    else there). A file problem is reported as the loader words it; any
    other failure names the step that failed.
    """
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    failure = None
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        if not debug:
            warnings.simplefilter("ignore")
            torch_logger.setLevel(logging.ERROR)
        try:
            yield
        except ProgramFileError as error:
            failure = _with_traceback(str(error), debug)
        except LimitExceeded as error:
            failure = _with_traceback(f"{action} stopped: {error}", debug)
        except ChildFailed as error:
            message = str(error) if error.speaks_for_itself else f"{action} failed: {error.kind}: {error}"
            failure = _with_traceback(message, debug)
        except Exception as error:
            said = getattr(error, "command_line", None)  # a problem the library words for the command line too
            failure = _with_traceback(said or f"{action} failed: {type(error).__name__}: {_first_line(error)}", debug)
        finally:
            torch_logger.setLevel(level)
    if failure is not None:
        _fail(failure, json_output)  # outside the redirection, so that --json's error reaches stdout


def _with_traceback(message: str, debug: bool) -> str:
    if debug:
        traceback.print_exc()
    return message


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no message"


def _fail(message: str, json_output: bool = False) -> None:
    _report_error(message, json_output)
    raise typer.Exit(2)


def _report_error(message: str, json_output: bool) -> None:
    """One line on stderr, whatever the message holds; with ``--json``, the same error as JSON on stdout."""
    line = one_line(" ".join(message.split()))
    if json_output:
        print(json.dumps({"ok": False, "error": line}), flush=True)
    print(f"strideguard: error: {line}", file=sys.stderr, flush=True)


def _stdout() -> Console:
    """The console for results: a terminal's own width; piped, ``COLUMNS`` when set, else wide enough for the
    whole tables. Text from a file is shown as it is (``tables.plain_console``)."""
    console = plain_console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return plain_console(width=160)




def _print_json(data: dict) -> None:
    typer.echo(json.dumps(data, indent=2))


def _print_layout(console: Console, title: str, report: LayoutReport, wide: bool) -> None:
    shown = print_fitted(console, layout_shapes(title, report), wide)
    for output in report.outputs if shown == NARROW else ():  # the columns the narrower table left out
        if output.cause or output.source_line:
            made = f" (at {literal(shown_source(output.source_line, SOURCE_LINE_SHOWN))})" if output.source_line else ""
            console.print(f"  {literal(output.name)}: {literal(output.cause or '-')}{made}")
    for symbol, meaning in report.symbols:
        console.print(f"  {literal(symbol)}: {literal(meaning)}")
    for output in report.copies_needed if shown != BLOCKS else ():  # the blocks say why in each output's own
        console.print(
            f"  fix copies {literal(output.name)} into dim order {list(output.target_dim_order)}: "
            f"{literal(output.explanation)}"
        )
    for output in report.outputs:
        if output.pushdown:
            saving = "" if output.flops_saved is None else f", {output.flops_saved:.0%} of those ops' FLOPs saved"
            console.print(
                f"  fix --pushdown computes {literal(output.name)} from pieces: {literal(shortened_pushdown(output.pushdown))}{saving}"
            )
    colour = {"in layout": "green", "out of layout": "red", "undecided": "yellow"}[report.verdict]
    console.print(f"[{colour}]{literal(report.summary)}[/]")


EXIT_CODES = {"in layout": 0, "out of layout": 1, "undecided": 3}
"""``inspect``'s and ``fix``'s exit code for each of a report's three answers (``LayoutReport.verdict``)."""


@app.command("inspect")
def inspect_command(
    program: ProgramFile,
    json_output: JsonOutput = False,
    plot: Annotated[
        Optional[str],  # as typed: a Path would drop the trailing "/" that makes it a folder
        typer.Option("--plot", help="Draw each output that fix copies, before and after, into this PNG file (written under exactly this name)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the --plot file if it exists.", metavar="")] = False,
    exact: Exact = False,
    device: TargetDevice = None,
    wide: Wide = False,
    debug: Debug = False,
) -> None:
    """Show every user output as AOTInductor will return it, and what fix would insert."""
    with _running("inspect", debug, json_output):
        if plot is not None:
            check_output_path(plot, input_path=program, overwrite=force)
        loaded = load_program(program)
        report = inspect(loaded, exact=exact, device=device)
    not_drawn: list[str] = []
    if plot is not None:
        with _running(f"writing the plot {plot}", debug, json_output):
            not_drawn = _write_plot(loaded, report, plot, program, force)
    if json_output:
        _print_json(report.to_dict())
    else:
        console = _stdout()
        _print_layout(console, f"{program}: {counted(len(report.outputs), 'user output')} ({report.dialect}, for {report.device})", report, wide)
        if plot is not None:
            console.print(f"wrote {literal(plot)}")
            for name in not_drawn:
                console.print(f"  {literal(name)} is not drawn: its sizes or strides are symbolic, and the file's example inputs do not fix them")
    raise typer.Exit(EXIT_CODES[report.verdict])


def _write_plot(loaded, report: LayoutReport, plot: str, program: Path, force: bool) -> list[str]:
    """The picture goes through the same careful write as a fixed program: never over the input or another file."""
    try:
        from .plot import plot_copies  # matplotlib loads only when a picture is asked for
    except ModuleNotFoundError as missing:
        raise ProgramFileError(plot, f"--plot needs {missing.name}: pip install 'strideguard[plot]'") from None

    title = f"strideguard inspect {program.name}"
    not_drawn: list[str] = []
    write_output(plot, lambda file: not_drawn.extend(plot_copies(loaded, report, file, title=title)), input_path=program, overwrite=force)
    return not_drawn


@app.command()
def fix(
    program: ProgramFile,
    output: Annotated[
        str,  # as typed: a Path would drop the trailing "/" that makes it a folder
        typer.Option("-o", "--output", help="Where to write the fixed program.", show_default=False),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.", metavar="")] = False,
    platform: Annotated[
        Platform,
        typer.Option(
            "--for",
            help="aoti: densify_outputs. executorch: prepare_for_aoti (for a .pt2 file, an ATen program, the same).",
        ),
    ] = Platform.aoti,
    break_aliases: Annotated[
        bool,
        typer.Option("--break-aliases", help="Also copy outputs sharing memory with an input, a weight or another output.", metavar=""),
    ] = False,
    exact: Exact = False,
    pushdown: Annotated[
        bool,
        typer.Option(
            "--pushdown",
            help="First compute each returned slice or select from pieces of its producers' inputs where that is exact "
            "(less compute, no copy; values may round differently: check with verify --reference PROGRAM).",
            metavar="",
        ),
    ] = False,
    device: TargetDevice = None,
    layout: LayoutOption = None,
    wide: Wide = False,
    debug: Debug = False,
) -> None:
    """Write PROGRAM with one copy per output that would come back strided; PROGRAM is never modified."""
    transform = densify_outputs if platform is Platform.aoti else prepare_for_aoti
    with _running("fix", debug):
        check_output_path(output, input_path=program, overwrite=force)
        loaded = load_program(program)
        # What --pushdown moves, from the graph (the fixed program holds only the pieces, not the ops saved).
        pushed = [o for o in inspect(loaded, device=device).outputs if o.pushdown] if pushdown else []
        fixed = transform(
            loaded, break_aliases=break_aliases, exact=exact, pushdown=pushdown, device=device,
            layouts=_layouts(layout),
        )
        report = inspect(fixed, exact=exact, device=device)
        save_program(fixed, output, input_path=program, overwrite=force)
    console = _stdout()
    console.print(f"wrote {literal(output)} (prepared for {platform.value}; {literal(program)} unchanged)")
    for output_pushed in pushed:
        saving = "" if output_pushed.flops_saved is None else f", {output_pushed.flops_saved:.0%} of those ops' FLOPs saved"
        console.print(f"pushed down {literal(output_pushed.name)}: {literal(shortened_pushdown(output_pushed.pushdown))}{saving}")
    if pushdown and not pushed:
        console.print("pushed down no output: no returned piece can be computed from pieces of its producers' inputs")
    _print_copied(console, [(o.name, o.source_line) for o in report.outputs if o.copy_of is not None])
    if exact:
        console.print(literal(_proven(fixed.graph_module.meta[PROOF_KEY])))
    _print_layout(console, f"{output}: {counted(len(report.outputs), 'user output')} ({report.dialect}, for {report.device})", report, wide)
    raise typer.Exit(EXIT_CODES[report.verdict])


def _layouts(requests: Optional[list[str]]) -> Optional[dict]:
    """``--layout NAME=LAYOUT`` options as ``densify_outputs``' ``layouts`` (a name that is all digits is an
    index); each value is checked against its output there."""
    if not requests:
        return None
    layouts: dict = {}
    for request in requests:
        name, separator, wanted = request.rpartition("=")
        if not separator or not name or not wanted:
            refused = ValueError(f"--layout {request!r}: give NAME=LAYOUT, e.g. image=channels_last or 0=keep")
            refused.command_line = str(refused)
            raise refused
        layouts[int(name) if name.isdigit() else name] = wanted
    return layouts


def _print_copied(console: Console, copied: list[tuple[str, Optional[str]]]) -> None:
    """The outputs a fix copied, by name, then each with the user's line that made it."""
    if not copied:
        console.print("copied no output")
        return
    names = ", ".join(literal(name) for name, _ in copied)
    console.print(f"copied {len(copied)} output{'s' if len(copied) != 1 else ''}: {names}")
    for name, line in copied:
        if line:
            console.print(f"  {literal(name)}: made at {literal(shown_source(line, SOURCE_LINE_SHOWN))}")


def _proven(proof: Proof) -> str:
    if proof.unproven:
        return (
            f"outputs {', '.join(proof.named(proof.unproven))} are not proven in their layout for {proof.target}: "
            f"{proof.unproven_reason}"
        )
    repaired = f"; copies strengthened for {', '.join(proof.named(proof.strengthened))}" if proof.strengthened else ""
    rounds = "1 lowering" if proof.rounds == 1 else f"{proof.rounds} lowerings"
    return (
        f"every user output proven in its layout by Inductor's lowering of the fixed program for {proof.target} "
        f"({rounds}, {proof.seconds:.1f} s{repaired})"
    )


@contextlib.contextmanager
def _spinner(what: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while a long step runs; none where stderr is not a terminal
    (a transient display still leaves a blank line there, and an error must be the one line)."""
    console = plain_console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with Progress(SpinnerColumn(), TextColumn(literal(what)), TimeElapsedColumn(), console=console, transient=True) as progress:
        progress.add_task(what, total=None)
        yield


@app.command("compile")
def compile_command(
    program: ProgramFile,
    output: Annotated[
        str,
        typer.Option("-o", "--output", help="Where to write the AOTInductor package.", show_default=False),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.", metavar="")] = False,
    layout: LayoutOption = None,
    device: CompileDevice = None,
    debug: Debug = False,
) -> None:
    """Fix PROGRAM, prove every output dense by Inductor's lowering of the fixed program, and compile it with
    AOTInductor into a package (torch._inductor.aoti_load_package loads it); PROGRAM is never modified."""
    with _running("compile", debug):
        check_output_path(output, input_path=program, overwrite=force)
        loaded = load_program(program)
        with tempfile.TemporaryDirectory(prefix="strideguard-compile-") as directory:
            with _spinner(f"proving and compiling {program.name} with AOTInductor"):
                package, proof = compile_proven(
                    loaded, os.path.join(directory, "package.pt2"), layouts=_layouts(layout), device=device
                )
            with open(package, "rb") as compiled:
                write_output(output, lambda file: shutil.copyfileobj(compiled, file), input_path=program, overwrite=force)
    console = _stdout()
    console.print(f"wrote {literal(output)} (an AOTInductor package; {literal(program)} unchanged)")
    _print_copied(console, [(proof.names[i], proof.source_lines[i] if i < len(proof.source_lines) else None) for i in proof.copied])
    console.print(literal(_proven(proof)))
    raise typer.Exit(0)


SMALLEST_LIMIT = 0.001
"""The smallest ``--timeout`` (seconds) or ``--memory`` (GiB) ``verify`` takes: a millisecond, a mebibyte."""


def _limit(unit: str):
    """The check of a numeric option, run as the option is read, before anything else: a finite number of
    ``unit`` of at least ``SMALLEST_LIMIT``. Click's ``min=`` let ``nan`` and ``inf`` through (every comparison
    with ``nan`` is false), and ``--memory inf`` then failed converting to bytes, with a traceback."""

    def check(context: typer.Context, parameter: typer.CallbackParam, value: Optional[float]) -> Optional[float]:
        if value is not None and not (math.isfinite(value) and value >= SMALLEST_LIMIT):
            raise typer.BadParameter(f"{value:g} is not a number of {unit} from {SMALLEST_LIMIT:g} up")
        return value

    return check


@app.command()
def verify(
    program: ProgramFile,
    device: Annotated[Device, typer.Option("--device", help="Where to compile and run.")] = Device.cpu,
    reference: Annotated[
        Optional[Path],
        typer.Option(
            "--reference",
            help="The program before fix: compile and run it too, and require every output to equal its output "
            "(bitwise; within verify's tolerance where fix --pushdown changed the computation).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Stop the check after this many seconds (it runs in a child process).",
            callback=_limit("seconds"),
        ),
    ] = DEFAULT_SECONDS,
    memory: Annotated[
        Optional[float],
        typer.Option(
            "--memory",
            help="Stop the check when its process holds more than this many GiB (default: three quarters of this "
            "machine's memory).",
            callback=_limit("GiB"),
            show_default=False,
        ),
    ] = None,
    json_output: JsonOutput = False,
    wide: Wide = False,
    debug: Debug = False,
) -> None:
    """Compile PROGRAM with AOTInductor, run it on its stored example inputs, and measure every output.

    The file is read here first (a file the loader refuses is refused at once), then read, compiled and run
    in a child process within --timeout and --memory."""
    if device is Device.cuda and not torch.cuda.is_available():
        _fail("--device cuda: this torch sees no CUDA device", json_output)
    limits = Limits(timeout, None if memory is None else int(memory * (1 << 30)))
    log = (lambda text: sys.stderr.write(text)) if debug else None
    with _running("verify", debug, json_output):
        # Read here first, as inspect reads: a file the loader refuses is refused in a fraction of a second,
        # before a child pays torch's import; the child reads it again, from the same bytes on disk.
        loaded = load_program(program)
        if reference is not None:
            # The reference is run on the program's inputs: one that takes or returns other shapes is refused
            # here, before anything runs (it would read past the inputs' memory in the child).
            difference = reference_difference(loaded, load_program(reference))
            if difference is not None:
                raise ProgramFileError(reference, f"not a reference for {program}: {difference}")
        with _spinner(f"compiling {program.name} with AOTInductor on {device.value} and running it"):
            measured = run_isolated(
                _verify_file, str(program), None if reference is None else str(reference), device.value,
                limits=limits, what=f"verify of {program}", log=log,
            )
    if json_output:
        _print_json(measured.to_dict())
    else:
        _print_verify(_stdout(), program, measured, wide)
    raise typer.Exit(0 if measured.ok else 1)


def _verify_file(program: str, reference: Optional[str], device: str) -> VerifyReport:
    """What ``verify`` does with the files, in the child ``run_isolated`` starts: read them as the loader
    allows, compile, run and measure."""
    loaded = load_program(program)
    reference_program = load_program(reference) if reference is not None else None
    return verify_program(loaded, device=device, reference=reference_program)


def _print_verify(console: Console, program: Path, measured: VerifyReport, wide: bool) -> None:
    title = f"{program}: compiled with AOTInductor on {measured.device} in {measured.compile_seconds:.1f} s and run"
    print_fitted(console, verify_shapes(title, measured), wide)
    console.print(("[green]" if measured.ok else "[red]") + literal(measured.summary) + "[/]")


@app.command()
def demo(debug: Debug = False) -> None:
    """Export the bundled policy head, inspect it, fix it, compile and run both."""
    from .demo import run_demo

    with warnings.catch_warnings():
        if not debug:
            warnings.simplefilter("ignore")  # torch's own deprecation notices are not the demo's story
        held = run_demo(_stdout())
    raise typer.Exit(0 if held else 1)


def main(arguments: Optional[list[str]] = None) -> None:
    """Run the command line; every way it can stop ends here with its exit code.

    Click's usage errors become one line (not typer's box); a signal ends the
    run with 128 plus its number after the command has removed what it was
    writing.
    """
    arguments = sys.argv[1:] if arguments is None else arguments
    json_output = "--json" in arguments
    with interruptible():
        try:
            code = _command().main(args=arguments, prog_name="strideguard", standalone_mode=False)
        except click_exceptions.NoArgsIsHelpError:
            code = 2  # the usage was printed: no command is a usage error, as the docs say
        except click_exceptions.ClickException as error:
            _report_error(_usage_problem(error), json_output)
            code = 2
        except typer.Abort:
            _report_error("aborted", json_output)
            code = 130
        except Interrupted as interrupted:
            _report_error(str(interrupted), json_output)
            code = interrupted.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def _command():
    """The command line as click runs it, every ``--help`` shown as the flag it is (no ``<bool>`` beside it)."""
    command = typer.main.get_command(app)
    for each in [command, *getattr(command, "commands", {}).values()]:
        found = each.get_help_option

        def without_type(context, found=found):
            option = found(context)
            if option is not None:
                option.metavar = ""
            return option

        each.get_help_option = without_type
        for parameter in getattr(each, "params", ()):
            if parameter.param_type_name == "argument":  # PROGRAM in the usage line, as the help text says it
                parameter._usage_display_name = lambda shown=parameter.metavar or parameter.name.upper(): shown
    return command


def _usage_problem(error: click_exceptions.ClickException) -> str:
    command = error.ctx.command_path if getattr(error, "ctx", None) else "strideguard"
    return f"{error.format_message()} (see '{command} --help')"
