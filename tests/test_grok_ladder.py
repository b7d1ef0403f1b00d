"""The issue-12 commands in their quick settings (shapes, metrics, intervals, plots written; not the
science): ``grok-ladder``, ``grok-gates``, the new metrics of every run, ``--quick`` keeping the
options given, and the figures' titles and legends."""
import json
import os
import shutil

import numpy as np
import pytest
import scipy.stats
import torch

from cvxtransformer.cli import build_parser, main
from cvxtransformer.core.problem import make_problem
from cvxtransformer.core.attention import AttentionProgram
from cvxtransformer.experiments import gate_solves, plots
from cvxtransformer.experiments.config import config_from_args
from cvxtransformer.experiments.runner import RunConfig, load_task, run
from cvxtransformer.experiments.stats import aggregate, aggregate_runs, fmt_mean, wilson_interval
from test_grok import load_report  # the loader of benchmarks/reproduction_report.py


@pytest.mark.parametrize("command", ["grok", "grok-suite", "kernel", "spectral", "grok-ladder"])
def test_quick_fills_only_the_options_not_given(command):
    args = build_parser().parse_args([command, "--quick", "--steps", "12", "--gates", "5", "--out-dir", "x"])
    cfg = config_from_args(args)
    assert (cfg.steps, cfg.gates) == (12, 5)                         # given: kept
    assert (cfg.dim, cfg.batch_size, cfg.eval_every) == (16, 64, 5)  # not given: quick
    plain = config_from_args(build_parser().parse_args([command, "--steps", "12", "--out-dir", "x"]))
    assert (plain.steps, plain.dim, plain.gates) == (12, 128, 8)


@pytest.mark.slow
def test_grok_quick_with_explicit_steps_prints_plain_words(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["grok", "--quick", "--steps", "12", "--modulus", "11", "--out-dir", out]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    assert m["steps_done"] == 12 and m["config"]["dim"] == 16
    assert "99% train: not reached" in printed and " at not reached" not in printed
    assert "x != 0:" in printed and "95% CI" in printed


def test_wilson_interval_and_aggregate():
    for k, n in ((0, 4608), (3, 40), (40, 40), (923, 923), (1, 1)):
        ci = scipy.stats.binomtest(k, n).proportion_ci(method="wilson")
        np.testing.assert_allclose(wilson_interval(k, n), [ci.low, ci.high], atol=1e-12)
    assert wilson_interval(0, 0) is None
    a = aggregate([0.2, None, 0.4])
    assert a["n"] == 2 and a["missing"] == 1 and a["mean"] == pytest.approx(0.3)
    assert a["std"] == pytest.approx(np.std([0.2, 0.4], ddof=1))
    runs = [{"config": {"seed": s}, "steps_to_99_test": v, "final_test_accuracy": acc}
            for s, v, acc in ((0, 100, 1.0), (1, None, 0.5))]
    agg = aggregate_runs(runs)
    assert agg["reached_99_test"] == "1/2" and agg["steps_to_99_test"]["mean"] == 100
    assert agg["final_test_accuracy"]["min"] == 0.5 and agg["seeds"] == [0, 1]


@pytest.mark.parametrize("model", ["relu", "convex"])
def test_metrics_match_an_independent_computation(model):
    cfg = RunConfig(modulus=11, model=model, steps=40, dim=16, gates=3, hidden=32, batch_size=16, eval_every=20,
                    lr=1e-2)
    m, _, net = run(cfg, return_net=True)
    _, _, tok, y = load_task(cfg)
    with torch.no_grad():
        logits = net(tok).double().numpy()
    tok, y = tok.numpy(), y.numpy()
    correct = logits.argmax(axis=1) == y
    rank = np.array([1 + np.sum(np.delete(row, t) >= row[t]) for row, t in zip(logits, y)])
    nz = tok[:, 0] != 0
    assert m["final_test_accuracy"] == pytest.approx(correct.mean())
    assert m["final_test_accuracy_nonzero"] == pytest.approx(correct[nz].mean())
    assert m["final_test_accuracy_zero"] == pytest.approx(correct[~nz].mean())
    assert m["true_label_mean_rank"] == pytest.approx(rank.mean())
    assert m["true_label_mean_rank_nonzero"] == pytest.approx(rank[nz].mean())
    assert m["final_test_accuracy_ci95"] == pytest.approx(wilson_interval(int(correct.sum()), len(y)))
    assert m["curves"]["test_accuracy_nonzero"][-1] == pytest.approx(correct[nz].mean())
    assert m["n_test_zero"] == int((~nz).sum()) and m["n_test_nonzero"] == int(nz.sum())


@pytest.mark.slow
def test_ladder_quick_aggregates_seeds_and_draws(tmp_path, capsys):
    out = tmp_path / "ladder"
    assert main(["grok-ladder", "--quick", "--models", "convex,relu", "--seeds", "0,1", "--modulus", "11",
                 "--budgets", "relu=20", "--out-dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["aggregates"]) == {"convex", "relu"} and len(s["rows"]) == 4
    for name, a in s["aggregates"].items():
        runs = [json.loads((out / name / f"seed{k}" / "metrics.json").read_text()) for k in (0, 1)]
        assert a["seeds"] == [0, 1] and a["final_test_accuracy_nonzero"]["values"] == [
            r["final_test_accuracy_nonzero"] for r in runs]
        assert a["steps_done"]["values"] == [20 if name == "relu" else 30] * 2
    assert (out / "relu" / "seed0" / "weights.npz").exists() and not (out / "convex" / "seed0" / "weights.npz").exists()
    assert all(os.path.getsize(f) > 1000 for f in s["figures"])
    capsys.readouterr()
    assert main(["grok-ladder", "--quick", "--models", "convex,relu", "--seeds", "0,1", "--modulus", "11",
                 "--budgets", "relu=20", "--out-dir", str(out), "--reuse"]) == 0
    assert capsys.readouterr().out.count("reusing the finished run") == 4


@pytest.mark.slow
def test_grok_gates_quick(tmp_path, capsys):
    teacher = str(tmp_path / "teacher")
    assert main(["grok", "--quick", "--model", "relu", "--modulus", "7", "--save-weights", "--out-dir", teacher]) == 0
    out = tmp_path / "runs" / "gates" / "all"
    assert main(["grok-gates", "--teacher", teacher, "--quick", "--betas", "0.5,0.2", "--out-dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["teacher"]["mask_agreement"] == 1.0 and s["teacher"]["neurons"] == 16
    assert [(r["kind"], r["h"], r["beta_fraction"]) for r in s["rows"]] == [
        (k, h, f) for k, h in (("oracle", 4), ("random", 2), ("random", 4)) for f in (0.5, 0.2)]
    for r in s["rows"]:
        assert 0 <= r["relative_gap"] and isinstance(r["certified"], bool)
        assert r["certified"] == (r["relative_gap"] <= 1e-3)
        low, high = r["final_test_accuracy_ci95"]
        assert low <= r["final_test_accuracy"] <= high and 0 <= r["train_accuracy"] <= 1
        assert r["beta"] == pytest.approx(r["beta_fraction"] * r["beta_max"])
    assert os.path.getsize(out / "gates.png") > 1000
    assert s["complete"] and not (out / "summary.partial.json").exists()
    for r in s["rows"]:  # the teacher's own readout is a feasible point: never below the certified optimum
        if r["kind"] == "oracle":
            assert r["objective"] * (1 - r["relative_gap"]) - 1e-9 <= r["reference_objective"] <= r["zero_objective"]
            assert (r["reference_scale"] == 0) == (r["beta_fraction"] >= r["reference_beta_fraction"])
            assert r["reference_test_accuracy_nonzero"] == r["teacher_accuracy_nonzero"]
        else:
            assert "reference_objective" not in r
    # that readout is the pruned teacher: program (12) with its gates and Z = w3 (x) u1 (x) u2
    t = gate_solves.load_teacher(teacher)
    keep = t.keep(4)
    program = AttentionProgram(12, t.data.X_test, 7, t.U1[keep], t.U2[keep])
    with torch.no_grad():
        logits = torch.relu(t.net.preactivations(torch.as_tensor(t.data.tokens_test))[:, keep]) @ t.net.W3[keep]
    np.testing.assert_allclose(program.forward(t.coefficients(keep)), logits.double().numpy(), rtol=1e-5, atol=1e-6)
    # beta_T, the largest beta at which a multiple of Z_T beats Z = 0, against finite differences of P
    d, Z = t.data, t.coefficients(keep)
    problem = make_problem(d.X_train, d.y_train, program=12, loss="cross_entropy", beta=1.0, U1=t.U1[keep],
                           U2=t.U2[keep], n_classes=7)
    beta_T = gate_solves.best_scale(problem, Z)[2]
    eps, P0 = 1e-6, problem.primal_objective(problem.zeros())
    for beta in (0.5 * beta_T, 2.0 * beta_T):
        at = problem.with_beta(beta)
        value, a, _ = gate_solves.best_scale(at, Z)
        assert (at.primal_objective(eps * Z) < P0) == (beta < beta_T) == (a > 0)
        assert value <= min(P0, at.primal_objective(a * Z)) + 1e-12
        for b in (0.5 * a, 2.0 * a + 1e-3):  # a minimises along the ray
            assert value <= at.primal_objective(b * Z) + 1e-9
    capsys.readouterr()
    only = tmp_path / "runs" / "gates" / "oracle_only"
    assert "path beta" not in capsys.readouterr().err                      # silent by default
    assert main(["grok-gates", "--teacher", teacher, "--quick", "--random-gates", "0", "--betas", "0.5",
                 "--progress", "--out-dir", str(only)]) == 0
    assert "path beta" in capsys.readouterr().err                          # each point as it is solved
    only_rows = json.loads((only / "summary.json").read_text())["rows"]
    assert [r["kind"] for r in only_rows] == ["oracle"]
    # the report merges the commands' summaries: one table of means over both, one figure, each command's rows
    docs = tmp_path / "docs"
    assert load_report().main(["--runs", str(tmp_path / "runs"), "--docs", str(docs)]) == 0
    text = (docs / "reproduction_numbers.md").read_text().split("## gates")[1].split("\n## ")[0]
    assert "### `all`" in text and "### `oracle_only`" in text
    # the same gates, split and beta solved by both commands: counted once, with the smaller gap
    best = min((s["rows"][0], only_rows[0]), key=lambda r: r["relative_gap"])
    assert f"| oracle | 4 | 0.5 | 1 | {int(best['certified'])}/1 | {best['relative_gap']:.1e} | " in text
    ref = only_rows[0]
    assert f"| {ref['zero_objective']:.1f} | {ref['reference_objective']:.1f} | {ref['reference_scale']:.3g} | " \
           f"{ref['reference_beta_fraction']:.4f} |" in text
    assert os.path.getsize(docs / "figures" / "reproduction" / "gates_all.png") > 1000
    # a rerun of the oracle points (issue 24) is its own section and figure; the first one stays
    shutil.copytree(only, tmp_path / "runs" / "gates_rerun" / "oracle_only")
    assert load_report().main(["--runs", str(tmp_path / "runs"), "--docs", str(docs)]) == 0
    rerun = (docs / "reproduction_numbers.md").read_text().split("## gates_rerun\n")[1].split("\n## ")[0]
    assert "### `oracle_only`" in rerun and "### `all`" not in rerun
    assert f"| oracle | 4 | 0.5 | 1 | {int(ref['certified'])}/1 | {ref['relative_gap']:.1e} | " in rerun
    assert {"gates_all.png", "gates_rerun_all.png"} <= set(os.listdir(docs / "figures" / "reproduction"))
    assert main(["grok-gates", "--teacher", teacher, "--quick", "--random-gates", "0", "--oracle-gates", "0",
                 "--out-dir", str(tmp_path / "none")]) == 2
    assert "both are 0" in capsys.readouterr().err and not (tmp_path / "none").exists()
    convex = str(tmp_path / "convex")
    assert main(["grok", "--quick", "--modulus", "7", "--out-dir", convex]) == 0
    capsys.readouterr()
    assert main(["grok-gates", "--teacher", convex, "--quick", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--teacher: expected a relu run" in err
    assert main(["grok-gates", "--teacher", teacher, "--betas", "2", "--out-dir", str(out)]) == 2
    assert "--betas: expected fractions" in capsys.readouterr().err


def fake_run(model, layers, seed=0, modulus=97):
    steps = [0, 10, 20]
    curves = {"step": steps, "train_accuracy": [0.1, 0.5, 1.0], "test_accuracy": [0.0, 0.1, 0.2],
              "test_accuracy_nonzero": [0.0, 0.0, 0.1], "train_loss": [4.0, 2.0, 1.0], "test_loss": [4.0, 5.0, 6.0]}
    cfg = dict(RunConfig(model=model, layers=layers, seed=seed, modulus=modulus).__dict__)
    return (f"{model} L={layers}", {"curves": curves, "config": cfg, "label": f"{model} L={layers}",
                                    "steps_to_99_train": 20, "steps_to_99_test": None, "steps_done": 20,
                                    "spectral": {"layer1.Z": {"steps": steps, "effective_rank": [3, 2, 1],
                                                              "top_singular_values": [[3, 2], [2, 1], [1, 1]]}}})


@pytest.mark.slow
def test_figures_name_the_task_and_keep_styles_apart(tmp_path):
    runs = [fake_run(m, L) for m in ("convex", "standard") for L in (1, 2)] + [fake_run("convex", 1, seed=1)]
    fig = plots.plot_accuracy(runs, str(tmp_path / "a.png"), "Figure 5")
    assert fig._suptitle.get_text() == "Figure 5: division mod 97 (train fraction 0.5)"
    ax = fig.axes[1]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["convex L=1", "convex L=2", "standard L=1",
                                                                   "standard L=2"]
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_child")]
    style = {ln.get_label(): (ln.get_color(), ln.get_linestyle()) for ln in lines if not ln.get_label().startswith("_")}
    assert style["convex L=1"][0] == style["convex L=2"][0] != style["standard L=1"][0]     # colour: the model
    assert style["convex L=1"][1] == style["standard L=1"][1] != style["convex L=2"][1]     # style: the depth
    fig = plots.plot_spectrum(runs[0][1], str(tmp_path / "s.png"))
    assert "division mod 97 (train fraction 0.5)" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["train", "test"] and "99% train" in legend
    rows = [dict(setting="p=97, L=1", model=m, task="division", train_fraction=0.5, steps_to_99_test=s,
                 grokking_steps=None, steps_done=30) for m, s in (("convex", None), ("standard", 20))]
    fig = plots.plot_grokking_bars(rows, str(tmp_path / "b.png"))
    assert "division (train fraction 0.5)" in fig._suptitle.get_text()
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["not reached\n(0/1 seeds)"] and not any(" at not reached" in t for t in texts)
