"""The timing protocol of the benchmarks' headline (benchmarks/fista_peers.py): every solver of a row runs as often
as the others, and right after each other one equally often (the caches a run finds are those its predecessor
left: a fixed order, even rotated, puts each solver after the same one in every round)."""
import collections
import itertools

import pytest

from test_docs import load


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_each_solver_runs_after_each_other_one_equally_often(n):
    orders = load("fista_peers").balanced_orders(n)
    if n == 2:  # they alternate
        assert orders == [[0, 1]]
        return
    assert all(sorted(row) == list(range(n)) for row in orders)
    within = collections.Counter(pair for row in orders for pair in zip(row, row[1:]))
    assert set(within) == set(itertools.permutations(range(n), 2)) and len(set(within.values())) == 1
    starts = [row[0] for row in orders[1:] + orders[:1]]
    assert all(start != row[-1] for start, row in zip(starts, orders))  # no solver runs twice in a row


def test_interleaved_runs_every_solver_as_often_after_each_other_one():
    peers = load("fista_peers")
    sequence = []

    def timer(name, seconds):
        def run():
            sequence.append(name)
            return seconds, seconds, name
        return run

    names = ["ct.solve", "backend", "skglm", "celer"]
    best = peers.interleaved({name: timer(name, 0.001 * (i + 1)) for i, name in enumerate(names)}, repeats=5)
    assert {name: best[name][0] for name in names} == {name: 0.001 * (i + 1) for i, name in enumerate(names)}
    counts = collections.Counter(sequence)
    assert len(set(counts.values())) == 1 and counts["celer"] % 4 == 0  # whole cycles of the square (fast runs)
    after = collections.Counter(zip(sequence, sequence[1:]))
    assert all(after[(a, b)] >= counts["celer"] // 4 for a, b in itertools.permutations(names, 2))
    assert not any(after[(a, a)] for a in names)
