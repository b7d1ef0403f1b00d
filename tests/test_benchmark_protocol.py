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


def test_a_fast_row_is_timed_again_interleaved_and_a_slow_one_is_not():
    """The part squared's rows whose ct.solve, backend and swept peers each took under FAST_ROW are timed again in
    the headline's interleaved rounds (each solver credited with that best run); a row with a slower one keeps its
    block timings, and a solver outside the fast ones (Clarabel) keeps its own."""
    pytest.importorskip("celer", reason="the bench extra (celer) is not installed")
    import numpy as np

    import cvxtransformer as ct
    peers = load("fista_peers")
    X = np.random.default_rng(0).standard_normal((200, 4, 3))
    problem = ct.make_problem(X, X[:, 1, 0] + X[:, 2, 1], program=8, beta_frac=0.1)
    D = peers.design(problem)
    block = {"ct.solve": peers.Run(seconds=0.2, points=[(0.1, 1e-3), (0.2, 1e-8)]), "fista": peers.Run(seconds=0.2),
             "celer": peers.Run(seconds=0.2, setting=1e-8), "clarabel": peers.Run(seconds=0.2)}
    runs = {name: peers.Run(**vars(run)) for name, run in block.items()}
    peers.retime(problem, D, runs)
    for name in ("ct.solve", "fista", "celer"):
        assert 0 < runs[name].seconds < 0.1 and runs[name].cpu > 0, name  # a run of this row takes a few ms
    assert runs["clarabel"].seconds == 0.2
    scale = runs["ct.solve"].seconds / 0.2
    assert np.allclose(runs["ct.solve"].points, [(0.1 * scale, 1e-3), (0.2 * scale, 1e-8)], rtol=1e-12, atol=0)
    slow = {name: peers.Run(**vars(run)) for name, run in block.items()}
    slow["celer"].seconds = 2 * peers.FAST_ROW
    peers.retime(problem, D, slow)
    assert {name: run.seconds for name, run in slow.items()} == {**{n: 0.2 for n in block}, "celer": 2 * peers.FAST_ROW}
