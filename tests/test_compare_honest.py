"""Issue 36, items 2 and 3: ``compare`` says when a network collapsed (output zero, or no decrease of its
objective), and its plots are readable: one colour per network, legends off the data, a grid of
attention maps, the objective against steps beside the objective against time."""
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.comparison.plots import plot_attention, plot_objective, plot_singular_values
from cvxtransformer.comparison.result import label
from cvxtransformer.datasets import student_teacher


@pytest.fixture(scope="module")
def problem():
    X, Y = student_teacher(N=40, n=4, d=3, c=2, seed=0)
    return ct.make_problem(X, Y, program=10, beta=1.0)


def _max_output(run, X):
    with torch.no_grad():
        return float(run.network(*run.network.encode_inputs(X)).abs().max())


def test_issue36_networks_forced_to_zero_are_reported_collapsed(problem, tmp_path):
    P = problem.with_beta(50 * problem.beta_max())  # weight decay far above beta_max: every weight goes to zero
    out = ct.compare(P, models="alternative,softmax", steps=200, lr=0.1, heads=5)
    s = out.to_dict()
    scale = np.max(np.abs(P.T))
    for name, run in out.models.items():
        m = s["models"][name]
        assert _max_output(run, P.program.X) <= 1e-6 * scale  # independently: the network outputs zero
        assert m["collapsed"] is True and m["collapse_reason"].startswith("zero output")
        assert m["max_abs_output"] == pytest.approx(_max_output(run, P.program.X), rel=1e-12, abs=1e-300)
        assert run.legend.endswith("[COLLAPSED]")
    text = str(out)
    assert "alternative (9), m = 5 COLLAPSED [1]:" in text and "softmax (3) COLLAPSED [2]:" in text
    assert "  [2] softmax (3) COLLAPSED: zero output" in text
    files = out.plot(tmp_path)
    assert (tmp_path / "objective.png").stat().st_size > 0 and "attention.png" in files


def test_issue36_a_network_whose_objective_does_not_move_is_reported_collapsed(problem):
    P = problem.with_beta(0.2 * problem.beta_max())
    out = ct.compare(P, models="alternative", steps=5, lr=1e-14, heads=5)
    run = out.models["alternative"]
    start, end = run.train.history.objective[0], run.objective
    assert abs(start - end) <= 1e-9 * abs(start)  # the objective did not move (lr 1e-14)
    assert run.report["collapsed"] and "no decrease of the objective" in run.report["collapse_reason"]
    assert "zero output" not in run.report["collapse_reason"]  # its output is not zero


def test_issue36_trained_networks_are_not_reported_collapsed(problem):
    P = problem.with_beta(0.2 * problem.beta_max())
    out = ct.compare(P, models="alternative,softmax", steps=100, heads=5)
    zero = 0.5 * np.sum(P.T ** 2)  # the zero network's objective, 1/2 sum y^2
    for name, run in out.models.items():
        m = out.to_dict()["models"][name]
        assert m["collapsed"] is False and m["collapse_reason"] is None
        assert run.objective < min(zero, run.train.history.objective[0])
        assert _max_output(run, P.program.X) > 0.1 * np.max(np.abs(P.T))
    assert "COLLAPSED" not in str(out)


def test_issue36_labels_name_a_model_once():
    assert label("gated_mhsa", "gated_mhsa", 9) == "gated MHSA, m = 9"
    assert label("relu_mhsa", "gated_mhsa", 20) == "ReLU MHSA, m = 20"
    assert label("alternative", 10, 24) == "alternative (9), m = 24"
    assert label("softmax", 10, None) == "softmax (3)"


def _colour(line):
    import matplotlib.colors

    return matplotlib.colors.to_hex(line.get_color())


def test_issue36_singular_values_one_colour_per_network_and_the_legend_off_the_axes(tmp_path):
    rng = np.random.default_rng(0)
    nets = {f"gated MHSA, m = {m}": np.sort(rng.random((2, 6)))[:, ::-1] for m in (9, 10, 20)}
    fig = plot_singular_values(np.sort(rng.random((2, 6)))[:, ::-1], nets, 0.5, tmp_path / "sv.png", "gated")
    assert (tmp_path / "sv.png").stat().st_size > 0
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == 2  # one per gate
    for ax in panels:
        colours = {line.get_label(): _colour(line) for line in ax.lines if line.get_label() in nets}
        assert len(colours) == 3 and len(set(colours.values())) == 3  # each network its own colour
        convex = [_colour(line) for line in ax.lines if line.get_label().startswith("convex")]
        assert convex and convex[0] not in colours.values()
        assert ax.get_legend() is None  # no legend inside a panel, over the data
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()][1:] == list(nets)
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in panels)


def test_issue36_attention_maps_in_a_grid_of_at_most_four_a_row(tmp_path):
    maps = {f"model {i}: group norms of a long title that wraps": (np.random.default_rng(i).random((8, 8)),
                                                                    "output token t") for i in range(7)}
    fig = plot_attention(maps, tmp_path / "attention.png")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 7
    rows = {}
    for ax in panels:
        rows.setdefault(round(ax.get_position().y0, 3), []).append(ax)
    assert len(rows) == 2 and max(len(r) for r in rows.values()) == 4
    assert min(ax.title.get_fontsize() for ax in panels) >= 10
    assert min(ax.xaxis.label.get_fontsize() for ax in panels) >= 10


def test_issue36_objective_against_step_beside_objective_against_time(tmp_path):
    S = 30
    runs = {name: {"model": model, "seconds": np.linspace(0, 3, S + 1) ** 2,
                   "objective": 10 + np.exp(-np.arange(S + 1)),
                   "lower_bound": 9.0 if model != "softmax" else None, "collapsed": model == "softmax"}
            for name, model in (("alternative (9)", "alternative"), ("softmax (3)", "softmax"))}
    fig = plot_objective(runs, {10: {"primal_objective": 9.5, "dual_objective": 9.5}}, tmp_path / "objective.png")
    by_x = {ax.get_xlabel(): ax for ax in fig.axes}
    steps = next(ax for x, ax in by_x.items() if x.startswith("step"))
    curves = {line.get_label(): line for line in steps.lines if line.get_label() in runs}
    assert set(curves) == set(runs)
    for name, line in curves.items():
        assert np.array_equal(line.get_xdata(), np.arange(1, S + 1))
        assert np.array_equal(line.get_ydata(), runs[name]["objective"][1:])
    crosses = [line for line in steps.lines if line.get_marker() == "x"]
    assert len(crosses) == 1 and _colour(crosses[0]) == _colour(curves["softmax (3)"])  # the collapsed run
    assert any(ax.get_xlabel() == "training time (s)" and ax.lines for ax in fig.axes)
