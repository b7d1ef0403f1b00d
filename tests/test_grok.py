"""The experiment commands end to end in their ``--quick`` settings (shapes, metrics recorded,
plots written; not the scientific outcome), and the pieces they are made of."""
import json
import os

import numpy as np
import pytest

from cvxtransformer.cli import main
from cvxtransformer.experiments.runner import RunConfig, _first, run
from cvxtransformer.experiments.spectra import rank_summary
from cvxtransformer.experiments.suite import claims
from cvxtransformer.nn.spectral import SpectralTracker, effective_rank, singular_values, stable_rank

METRICS = ("steps_to_99_train", "steps_to_99_test", "grokking_steps", "final_train_accuracy",
           "final_test_accuracy", "final_test_loss", "curves", "spectral", "config", "status",
           "final_test_accuracy_nonzero", "final_test_accuracy_zero", "true_label_mean_rank",
           "final_test_accuracy_ci95")
PLOTS = ("accuracy.png", "loss.png", "spectrum.png")


def check_run_dir(path, layers, model):
    with open(os.path.join(path, "metrics.json")) as f:
        m = json.load(f)
    assert all(k in m for k in METRICS)
    curves = m["curves"]
    lengths = {len(v) for v in curves.values()}
    assert len(lengths) == 1 and lengths.pop() >= 2
    assert curves["step"][0] == 0 and curves["step"][-1] == m["steps_done"]
    assert all(0 <= a <= 1 for a in curves["train_accuracy"] + curves["test_accuracy"])
    assert 0 <= m["final_test_accuracy"] <= 1 and m["final_test_accuracy"] == curves["test_accuracy"][-1]
    for key in ("steps_to_99_train", "steps_to_99_test"):
        assert m[key] is None or m[key] in curves["step"]
    low, high = m["final_test_accuracy_ci95"]
    assert 0 <= low <= m["final_test_accuracy"] <= high <= 1
    assert m["n_test_nonzero"] + m["n_test_zero"] == m["n_test"]
    names = list(m["spectral"])
    if model.startswith("convex"):
        assert names == [f"layer{i + 1}.Z" for i in range(layers)]
    elif model == "standard":
        assert len(names) == 6 * layers + 1
    elif model == "ucsd":
        assert len(names) == 3 * layers + 1
    else:
        assert names == ["embedding", "W2", "W3"]
    with np.load(os.path.join(path, "spectra.npz")) as f:
        steps = f["steps"]
        assert steps[0] == 0 and steps[-1] == m["steps_done"]
        for name in names:
            assert f[f"{name}.singular_values"].shape[0] == len(steps)
            np.testing.assert_allclose(f[f"{name}.singular_values"][:, :3],
                                       np.array(m["spectral"][name]["top_singular_values"])[:, :3], rtol=1e-9)
    for png in PLOTS:
        with open(os.path.join(path, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return m


@pytest.mark.slow
@pytest.mark.parametrize("args, layers, model", [
    (["--modulus", "97", "--layers", "2", "--model", "convex"], 2, "convex"),
    (["--modulus", "15", "--layers", "1", "--model", "standard"], 1, "standard"),
    (["--task", "periodicity", "--layers", "2", "--kernel-features", "8"], 2, "convex"),
    (["--modulus", "31", "--model", "convex-learned-gates"], 1, "convex-learned-gates"),
    (["--modulus", "31", "--model", "relu"], 1, "relu"),
    (["--modulus", "15", "--model", "ucsd", "--reading", "power"], 1, "ucsd"),
])
def test_grok_quick(tmp_path, capsys, args, layers, model):
    out = str(tmp_path / "run")
    assert main(["grok", *args, "--quick", "--out-dir", out, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    m = check_run_dir(out, layers, model)
    assert printed["steps_to_99_test"] == m["steps_to_99_test"]
    assert m["steps_done"] == 30 and m["config"]["dim"] == 16 and m["status"] == "budget"
    assert m["config"]["layers"] == layers and m["config"]["model"] == model


@pytest.mark.slow
def test_grok_suite_quick(tmp_path, capsys):
    out = str(tmp_path / "suite")
    # two of the four settings keep the test short; every figure is still drawn
    assert main(["grok-suite", "--quick", "--settings", "97:1,15:4", "--out-dir", out]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    assert len(s["rows"]) == 4
    assert {(r["modulus"], r["layers"], r["model"]) for r in s["rows"]} == {
        (p, L, m) for p, L in ((97, 1), (15, 4)) for m in ("convex", "standard")}
    for r in s["rows"]:
        check_run_dir(os.path.join(out, f"p{r['modulus']}_L{r['layers']}_{r['model']}", "seed0"), r["layers"],
                      r["model"])
    assert set(s["aggregates"]) == {f"p{p}_L{L}_{m}" for p, L in ((97, 1), (15, 4)) for m in ("convex", "standard")}
    assert set(s["figures"]) == {"fig4_mod97_L1.png", "fig5_mod97_L1_L2.png", "fig6_mod15_L1_L4.png",
                                 "fig7_grokking.png"}
    assert all(os.path.getsize(p) > 1000 for p in s["figures"].values())
    assert "mod97_convex_fewer_iterations_than_standard_L1" in s["claims"]
    assert s["claims"]["mod97_second_layer_helps_convex"] is None          # p = 97, L = 2 not run


@pytest.mark.slow
def test_kernel_quick(tmp_path, capsys):
    out = str(tmp_path / "kernel")
    assert main(["kernel", "--quick", "--out-dir", out]) == 0
    printed = capsys.readouterr().out.splitlines()
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    assert s["claims"]["decided"] is False and "decides nothing" in s["note"]  # a quick run says so
    at = printed.index(json.dumps(s["claims"]))
    assert printed[at + 1] == f"note: {s['note']}"
    assert [r["name"] for r in s["rows"]] == ["convex", "convex_kernel", "standard"]
    assert s["rows"][1]["kernel_features"] == 16 and s["rows"][0]["task"] == "periodicity"
    assert s["claims"]["kernel_helps"] in (True, False, None)
    assert os.path.getsize(os.path.join(out, "kernel_accuracy.png")) > 1000
    check_run_dir(os.path.join(out, "convex_kernel"), 2, "convex")


def load_report():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "reproduction_report.py")
    spec = importlib.util.spec_from_file_location("reproduction_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


@pytest.mark.slow
def test_reproduction_report_collects_the_runs(tmp_path, capsys):
    report = load_report()
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    assert main(["kernel", "--quick", "--out-dir", str(runs / "kernel")]) == 0
    assert report.main(["--runs", str(runs), "--docs", str(docs)]) == 0
    text = (docs / "reproduction_numbers.md").read_text()
    with open(runs / "kernel" / "summary.json") as f:
        summary = json.load(f)
    for r in summary["rows"]:  # one table row per run, with its numbers
        assert f"| `{r['name']}` | periodicity | 97 | 2 | " in text
        low, high = r["final_test_accuracy_ci95"]
        assert f"| {r['final_test_accuracy']:.3f} [{low:.3f}, {high:.3f}] |" in text
    claim = summary["claims"]["kernel_helps"]
    assert f"- `kernel_helps`: {'null' if claim is None else str(claim).lower()}" in text
    assert "Missing: no folder" in text and "## grok" in text          # the experiments not run
    copied = sorted(os.listdir(docs / "figures" / "reproduction"))
    assert copied == ["kernel_convex_kernel_spectrum.png", "kernel_convex_spectrum.png", "kernel_kernel_accuracy.png",
                      "kernel_standard_spectrum.png"]
    assert all(f"(figures/reproduction/{name})" in text for name in copied)
    # a second report without the kernel folder keeps its section and figures, marked as kept
    (docs / "figures" / "reproduction" / "stray.png").write_bytes(b"x")
    os.rename(runs / "kernel", tmp_path / "kernel_elsewhere")
    assert main(["grok-ladder", "--quick", "--models", "convex", "--out-dir", str(runs / "ladder")]) == 0
    assert report.main(["--runs", str(runs), "--docs", str(docs)]) == 0
    text2 = (docs / "reproduction_numbers.md").read_text()
    kept = text2.split("## kernel")[1].split("## ")[0]
    assert "_Kept from the previous report" in kept and "kernel_helps" in kept
    assert sorted(os.listdir(docs / "figures" / "reproduction")) == sorted(
        copied + ["ladder_ladder.png", "ladder_ladder_curves.png"])      # no per-run spectra over seeds
    assert "| `convex` | 0 | 0/1 |" in text2.split("## ladder")[1]          # the aggregate table


@pytest.mark.slow
def test_spectral_quick(tmp_path):
    out = str(tmp_path / "spectral")
    assert main(["spectral", "--quick", "--out-dir", out]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    assert set(s["effective_rank"]) == {"convex", "convex_kernel"}
    for ranks in s["effective_rank"].values():
        assert set(ranks) == {"layer1.Z", "layer2.Z"}
        for r in ranks.values():
            assert r["start"] >= 1 and isinstance(r["rank_collapse"], bool)
    m = check_run_dir(os.path.join(out, "convex"), 2, "convex")
    assert m["spectral_every"] == m["eval_every"]          # spectra at every evaluation
    assert os.path.getsize(os.path.join(out, "effective_rank.png")) > 1000


@pytest.mark.parametrize("argv, match", [
    (["grok", "--model", "standard", "--kernel-features", "8"], "kernel_features"),
    (["grok", "--modulus", "1"], "modulus: expected an integer >= 1|p: expected an integer modulus"),
    (["grok", "--steps", "0"], "steps: expected an integer >= 1"),
    (["grok", "--task", "periodicity", "--modulus", "5"], "p: expected an integer modulus >= 8"),
    (["grok", "--train-fraction", "1.5"], "train_fraction"),
    (["grok", "--model", "standard", "--dim", "10", "--heads", "4"], "heads: expected a divisor"),
    (["grok-suite", "--settings", "97-1"], "--settings: expected items P:L"),
    (["kernel", "--lr", "-1"], "lr: expected a finite number > 0"),
])
def test_user_errors_exit_2(tmp_path, capsys, argv, match):
    assert main([*argv, "--out-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err
    assert pytest.importorskip("re").search(match, err)


def test_unwritable_out_dir_is_a_user_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["grok", "--quick", "--out-dir", str(blocker / "sub")]) == 2
    assert "--out-dir" in capsys.readouterr().err


def test_early_stop_and_steps_to_99():
    """p = 5: 20 equations. Bookkeeping: the run stops at the first evaluation where train and
    test accuracy are both >= 99%, or runs the whole budget."""
    m, tracker = run(RunConfig(modulus=5, train_fraction=0.8, steps=300, dim=16, gates=4, batch_size=8,
                               eval_every=10, lr=1e-2))
    c = m["curves"]
    both = [s for s, a, b in zip(c["step"], c["train_accuracy"], c["test_accuracy"]) if a >= 0.99 and b >= 0.99]
    if both:
        assert m["status"] == "reached 99%" and m["steps_done"] == both[0]
    else:
        assert m["status"] == "budget" and m["steps_done"] == 300
    if m["steps_to_99_test"] is not None:
        assert m["grokking_steps"] == m["steps_to_99_test"] - m["steps_to_99_train"]
    assert tracker.steps[-1] == m["steps_done"]
    m2, _ = run(RunConfig(modulus=5, train_fraction=0.8, steps=50, dim=16, gates=4, batch_size=8, eval_every=10,
                          lr=1e-2, stop_at_99=False))
    assert m2["steps_done"] == 50 and m2["status"] == "budget"


def test_first_crossing():
    assert _first([0, 10, 20, 30], [0.5, 0.99, 0.2, 1.0]) == 10
    assert _first([0, 10], [0.5, 0.98]) is None


def test_claims_handle_not_reached():
    rows = [dict(modulus=97, layers=1, model="convex", steps_to_99_test=500, grokking_steps=100),
            dict(modulus=97, layers=1, model="standard", steps_to_99_test=None, grokking_steps=None),
            dict(modulus=15, layers=1, model="convex", steps_to_99_test=None, grokking_steps=None),
            dict(modulus=15, layers=4, model="convex", steps_to_99_test=300, grokking_steps=50)]
    c = claims(rows)
    assert c["mod97_convex_fewer_iterations_than_standard_L1"] is True
    assert c["mod97_second_layer_helps_convex"] is None
    assert c["mod15_convex_L1_fails"] is True and c["mod15_convex_L4_succeeds"] is True
    assert c["mod15_standard_L4_succeeds"] is None and c["mod97_L1_convex_less_grokking"] is None


def test_rank_summary_detects_a_collapse():
    metrics = {"steps_to_99_train": 10, "steps_to_99_test": 30,
               "spectral": {"W": {"steps": [0, 10, 20, 30, 40], "effective_rank": [5, 8, 6, 3, 2]}}}
    r = rank_summary(metrics)["W"]
    assert r["max_before_generalisation"] == 8 and r["at_99_test"] == 3 and r["at_99_train"] == 8
    assert r["collapse_ratio"] == pytest.approx(3 / 8) and r["rank_collapse"] is True


# ----------------------------------------------------------------------------- spectral pieces
@pytest.mark.parametrize("shape", [(7, 7), (40, 5), (5, 40), (12, 9)])
def test_singular_values_match_numpy(shape):
    W = np.random.default_rng(0).standard_normal(shape)
    np.testing.assert_allclose(singular_values(W), np.linalg.svd(W, compute_uv=False), rtol=1e-8)


def test_rank_measures():
    assert effective_rank(np.ones(6)) == pytest.approx(6)
    assert effective_rank(np.array([1.0, 0, 0])) == pytest.approx(1)
    assert effective_rank(np.zeros(3)) == 0
    assert 1 < effective_rank(np.array([3.0, 1.0])) < 2
    assert stable_rank(np.array([2.0, 2.0, 0.0])) == pytest.approx(2)
    t = SpectralTracker()
    t.record(0, {"A": np.eye(4), "B": np.ones((3, 2))})
    t.record(5, {"A": 2 * np.eye(4), "B": np.ones((3, 2))})
    arrays = t.arrays()
    assert arrays["A.singular_values"].shape == (2, 4) and list(arrays["steps"]) == [0, 5]
    assert t.summary()["B"]["effective_rank"] == pytest.approx([1.0, 1.0])


@pytest.mark.slow
def test_reuse_loads_a_finished_run_instead_of_training(tmp_path, capsys):
    out = str(tmp_path / "suite")
    argv = ["grok-suite", "--quick", "--settings", "15:1", "--models", "convex", "--out-dir", out]
    assert main(argv) == 0
    path = os.path.join(out, "p15_L1_convex", "seed0", "metrics.json")
    first = os.path.getmtime(path)
    capsys.readouterr()
    assert main(argv + ["--reuse"]) == 0
    assert "reusing the finished run" in capsys.readouterr().out
    assert os.path.getmtime(path) == first
    assert main(argv + ["--reuse", "--seed", "1"]) == 0          # other settings: trained again
    assert "reusing" not in capsys.readouterr().out


def test_kernel_helps_needs_a_margin():
    from cvxtransformer.experiments.kernel import kernel_helps

    run = lambda s99, acc: {"steps_to_99_test": s99, "final_test_accuracy": acc}
    assert kernel_helps(run(None, 0.342), run(None, 0.347)) is None          # within one point: a tie
    assert kernel_helps(run(None, 0.30), run(None, 0.50)) is True
    assert kernel_helps(run(None, 0.50), run(None, 0.30)) is False
    assert kernel_helps(run(900, 1.0), run(400, 1.0)) is True
    assert kernel_helps(run(400, 1.0), run(None, 0.9)) is False
