"""The two pass ratios of issue 28 on one view-heavy Edge graph: quick, for a change to the pass.

strideguard's drop-in ``ReplaceViewCopyWithViewPass`` and ``prepare_for_aoti``, each over ExecuTorch 1.5.1's
own ``ReplaceViewCopyWithViewPass`` on the same program, called as ``AotiBackend.preprocess`` calls them
(``bench/run.py`` does the same at every size, with fewer repeats). The three calls interleaved, and the
median over ``--repeats`` of each call's ratio to ExecuTorch's call beside it, in ``--rounds`` rounds, all
in one process so that the ratios share the machine's state:

    .venv/bin/python bench/pass_ratio.py --nodes 2000    # 1,651 Edge nodes
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strideguard  # noqa: E402
from bench.run import interleaved_seconds, median_ratio  # noqa: E402
from bench.synthetic import export_view_heavy  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000, help="ATen nodes asked of bench/synthetic.py")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from executorch.backends.aoti.passes.replace_view_copy_with_view import (
        ReplaceViewCopyWithViewPass as ExecuTorchPass,
    )

    from strideguard.executorch import ReplaceViewCopyWithViewPass as DropIn
    from strideguard.testing.executorch_cpu import aoti_edge_program

    edge = aoti_edge_program(export_view_heavy(args.nodes))
    nodes = len(edge.graph.nodes)

    def fresh(program):
        copied = copy.copy(program)
        copied._graph_module = copy.deepcopy(program.graph_module)
        return copied

    DropIn()(fresh(edge))  # the first calls import and trace once
    strideguard.prepare_for_aoti(edge)
    for _ in range(args.rounds):
        times = interleaved_seconds({
            "executorch": lambda: (ExecuTorchPass(), copy.deepcopy(edge.graph_module)),
            "drop_in": lambda: (DropIn(), fresh(edge)),
            "prepare": lambda: (strideguard.prepare_for_aoti, edge),
        }, args.repeats)
        print(f"view-heavy, {nodes} Edge nodes: ExecuTorch's pass {statistics.median(times['executorch']) * 1e3:.1f} ms; "
              f"drop-in {median_ratio(times, 'drop_in', 'executorch'):.2f} times it, prepare_for_aoti "
              f"{median_ratio(times, 'prepare', 'executorch'):.2f} (medians of {args.repeats} interleaved calls' ratios)",
              flush=True)

if __name__ == "__main__":
    main()
