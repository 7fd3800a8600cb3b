"""The ``strideguard`` command line: a thin layer over the library."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@app.command()
def demo() -> None:
    """Export the bundled policy head, inspect it, fix it, compile and run both."""
    from .demo import run_demo

    raise typer.Exit(0 if run_demo() else 1)


@app.callback()
def _root() -> None:
    """strideguard: outputs of AOTInductor-compiled methods, dense in the layout promised."""


def main() -> None:
    app()
