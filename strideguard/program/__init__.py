"""Stage 1, what a program is: an exported program and the facts of its graph.

``exported`` reads and rebuilds an ``ExportedProgram`` without touching the original;
``dialect`` holds every difference between ATen and the two Edge modes;
``promises`` the layout a program promises for each output; ``copies`` the
copy strideguard inserts, built and recognised in one place; ``ops`` the op
families strideguard decides by; ``density`` whether strides are dense in a
dim order; ``fake_values`` and ``view_values`` the values a graph holds;
``naming`` the user's names; ``reports`` the typed records every report is
made of; ``quiet`` torch's notices silenced around strideguard's calls.

May import: torch only.
"""
