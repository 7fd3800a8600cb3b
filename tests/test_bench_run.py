"""``bench/run.py`` run for some sizes keeps the figures of the sizes it did not run again."""

from bench.run import _merged


def test_a_partial_run_replaces_only_the_sizes_it_measured():
    stored = [
        {"graphs": "view-heavy", "nodes": 377, "ratio": 0.77},
        {"graphs": "blocks", "nodes": 66744, "ratio": 0.50},
        {"graphs": "blocks", "nodes": 414, "ratio": 0.65},
    ]
    measured = [{"graphs": "blocks", "nodes": 414, "ratio": 0.75}, {"graphs": "blocks", "nodes": 2424, "ratio": 0.52}]
    merged = _merged(stored, measured, ("graphs", "nodes"))
    assert merged == [
        {"graphs": "blocks", "nodes": 414, "ratio": 0.75},
        {"graphs": "blocks", "nodes": 2424, "ratio": 0.52},
        {"graphs": "blocks", "nodes": 66744, "ratio": 0.50},
        {"graphs": "view-heavy", "nodes": 377, "ratio": 0.77},
    ]
    assert _merged([], [], ("nodes",)) == [] and _merged(stored, [], ("graphs", "nodes"))[0]["nodes"] == 414
