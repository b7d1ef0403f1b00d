"""A bad-input walk of the whole public API and command line (issue 20): every entry point of the
README and docs/architecture.md, every subcommand. Each row is one call that must fail as a user
error: the Python API raises the error class with the argument named first in its message; the
command line exits 2 with one line on stderr, ``cvxtransformer <command>: error: <name>...``, and no
traceback. Either way no file is written or changed. Adding an entry point is adding one row.

The rows hold the calls that failed in issue 20 (a traceback, a silent coercion, a misleading
message) next to older ones."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.errors import InvalidInputError, MissingDependencyError

from test_user_errors import assert_one_line_error

ERROR = InvalidInputError
CORE = ["--program", "10", "--loss", "squared"]
CE = ["--program", "10", "--loss", "cross_entropy"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Input files (read-only for the walk: a row that writes or changes one fails) and the objects
    the Python rows take."""
    folder = tmp_path_factory.mktemp("walk")
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal((30, 2))
    labels = rng.integers(0, 3, 30)
    files = {
        "data": dict(X=X, y=y), "labels_1e9": dict(X=X, y=np.r_[labels[:-1], 10**9]),
        "x_1e300": dict(X=1e300 * X, y=y), "x_bool": dict(X=X > 0, y=y), "x_str": dict(X=X.astype(str), y=y),
        "beta_str": dict(Z=np.zeros((2, 4, 3)), beta=np.array("abc")),
        "beta_vector": dict(Z=np.zeros((2, 4, 3)), beta=np.array([0.1, 0.2])),
        "z_1e200": dict(Z=np.full((2, 4, 3), 1e200)), "z_complex": dict(Z=np.zeros((2, 4, 3)) + 1j),
        "v_complex": dict(Z=np.zeros((2, 4, 3)), V=np.zeros((30, 2)) + 1j),
    }
    rows_1e400 = '{"hash": "sha256", "N": 30, "pieces": [{"rows": [0, 1e400], "X": "0", "y": "0"}], "gates": null}'
    files["fingerprint_1e400"] = dict(Z=np.zeros((2, 4, 3)), beta=np.array(1.0), fingerprint=np.array(rows_1e400))
    files["fingerprint_nested"] = dict(Z=np.zeros((2, 4, 3)), beta=np.array(1.0), fingerprint=np.array("[" * 10**5))
    for name, arrays in files.items():
        np.savez(folder / f"{name}.npz", **arrays)
    (folder / "text.npz").write_text("X y\n1 2\n")
    (folder / "garbage").mkdir()
    (folder / "garbage" / "X.npy").write_bytes(bytes(range(256)) * 4)
    np.save(folder / "garbage" / "y.npy", y)
    for i, rows in enumerate(np.array_split(np.arange(30), 3)):
        (folder / "shards" / f"s{i}").mkdir(parents=True)
        np.save(folder / "shards" / f"s{i}" / "y.npy", y[rows])
        if i != 1:  # shard s1 lost its X.npy
            np.save(folder / "shards" / f"s{i}" / "X.npy", X[rows])
    (folder / "a_file").write_text("x")
    (folder / "read_only.npz").write_bytes(b"an earlier result")
    (folder / "read_only.npz").chmod(0o444)
    problem = ct.make_problem(X, y, program=10, beta=1.0)
    gated = ct.make_problem(X, y, program="gated_mhsa", beta=1.0, gates=2)
    return {"dir": folder, "X": X, "y": y, "labels": labels, "problem": problem, "Z": problem.zeros(), "gated": gated}


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in sorted(Path(folder).rglob("*"))}


# (id, call, error class, the name the message starts with). A call is a function of env (the Python
# API) or an argv list whose "{dir}" is the folder of input files (the command line: error class
# None, exit code 2).
API = [
    # --- make_problem
    ("make_problem X strings", lambda e: ct.make_problem(e["X"].astype(str), e["y"], beta=1.0), ERROR, "X"),
    ("make_problem X bool", lambda e: ct.make_problem(e["X"] > 0, e["y"], beta=1.0), ERROR, "X"),
    ("make_problem X complex", lambda e: ct.make_problem(e["X"] + 1j, e["y"], beta=1.0), ERROR, "X"),
    ("make_problem X of 1e300", lambda e: ct.make_problem(1e300 * e["X"], e["y"], beta=1.0), ERROR, "X"),
    ("make_problem y bool", lambda e: ct.make_problem(e["X"], e["y"] > 0, beta=1.0), ERROR, "y"),
    ("make_problem y strings", lambda e: ct.make_problem(e["X"], e["y"].astype(str), beta=1.0), ERROR, "y"),
    ("make_problem label 1e9", lambda e: ct.make_problem(e["X"], np.r_[e["labels"][:-1], 10**9],
                                                         loss="cross_entropy", beta=1.0), ERROR, "y"),
    ("make_problem n_classes 2.5", lambda e: ct.make_problem(e["X"], e["labels"] % 2, loss="cross_entropy",
                                                             n_classes=2.5, beta=1.0), ERROR, "n_classes"),
    ("make_problem gates bool", lambda e: ct.make_problem(e["X"], e["y"], program=12, U1=np.ones((2, 4), bool),
                                                          U2=np.ones((2, 3)), beta=1.0), ERROR, "U1"),
    ("with_beta string", lambda e: e["problem"].with_beta("0.1"), ERROR, "beta"),
    # --- solve, certify, solve_path, recover_weights, nonconvex_objective
    ("solve None", lambda e: ct.solve(None), ERROR, "problem"),
    ("solve an array", lambda e: ct.solve(e["X"]), ERROR, "problem"),
    ("solve solver", lambda e: ct.solve(e["problem"], solver="gurobi"), ERROR, "solver"),
    ("solve init complex", lambda e: ct.solve(e["problem"], "fista", init=e["Z"] + 1j), ERROR, "init"),
    ("certify an array", lambda e: ct.certify(e["X"], e["Z"]), ERROR, "problem"),
    ("certify Z complex", lambda e: ct.certify(e["problem"], e["Z"] + 1j), ERROR, "Z"),
    ("certify Z strings", lambda e: ct.certify(e["problem"], e["Z"].astype(str)), ERROR, "Z"),
    ("certify Z of 1e200", lambda e: ct.certify(e["problem"], e["Z"] + 1e200), ERROR, "Z"),
    ("certify V complex", lambda e: ct.certify(e["problem"], e["Z"], V=np.zeros((30, 2)) + 1j), ERROR, "V"),
    ("solve_path None", lambda e: ct.solve_path(None), ERROR, "problem"),
    ("solve_path betas strings", lambda e: ct.solve_path(e["problem"], betas=["0.1"]), ERROR, "betas"),
    ("recover_weights an array", lambda e: ct.recover_weights(e["X"], e["Z"]), ERROR, "problem"),
    ("recover_weights Z complex", lambda e: ct.recover_weights(e["problem"], e["Z"] + 1j), ERROR, "Z"),
    ("nonconvex_objective None", lambda e: ct.nonconvex_objective(None, None), ERROR, "problem"),
    ("beta_grid ratio", lambda e: ct.beta_grid(1.0, ratio=2.0), ERROR, "ratio"),
    # --- builders, data, datasets, networks, estimators
    ("build_primal None", lambda e: _builders().build_primal(None), ERROR, "problem"),
    ("open_data text file", lambda e: _open_data(e["dir"] / "text.npz"), ERROR, "DATA"),
    ("open_data missing shard", lambda e: _open_data(e["dir"] / "shards"), ERROR, "DATA"),
    ("student_teacher N", lambda e: _datasets().student_teacher(N=0, n=4, d=3, c=2), ERROR, "N"),
    ("AlternativeAttention inputs bool", lambda e: _networks().AlternativeAttention(4, 3, 2, heads=1).encode_inputs(
        e["X"] > 0), ERROR, "X"),
    ("AttentionRegressor fit X bool", lambda e: _estimators().AttentionRegressor().fit(e["X"] > 0, e["y"]), ERROR,
     "X"),
    ("AttentionClassifier fit n_classes", lambda e: _estimators().AttentionClassifier(tol=2.0).fit(e["X"], e["labels"]),
     ERROR, "tol"),
    # --- the gated-ReLU MHSA family, certify_network, compare
    ("make_problem gated H bool", lambda e: ct.make_problem(e["X"], e["y"], program="gated_mhsa",
                                                            H=np.ones((2, 4, 4), bool), beta=1.0), ERROR, "H"),
    ("make_problem gated H complex", lambda e: ct.make_problem(e["X"], e["y"], program="gated_mhsa",
                                                               H=np.ones((2, 4, 4)) + 1j, beta=1.0), ERROR, "H"),
    ("make_problem H on program 10", lambda e: ct.make_problem(e["X"], e["y"], program=10, H=np.ones((2, 4, 4)),
                                                               beta=1.0), ERROR, "H"),
    ("make_problem gated gates 0", lambda e: ct.make_problem(e["X"], e["y"], program="gated_mhsa", gates=0,
                                                             beta=1.0), ERROR, "gates"),
    ("certify gated Z complex", lambda e: ct.certify(e["gated"], e["gated"].zeros() + 1j), ERROR, "Z"),
    ("certify_network an array", lambda e: ct.certify_network(e["X"], {"W1": e["X"]}), ERROR, "problem"),
    ("certify_network a string", lambda e: ct.certify_network(e["problem"], "weights"), ERROR, "network"),
    ("certify_network keys", lambda e: ct.certify_network(e["problem"], {"A": e["X"]}), ERROR, "network"),
    ("compare None", lambda e: ct.compare(None), ERROR, "problem"),
    ("compare solver", lambda e: ct.compare(e["problem"], solver="gurobi"), ERROR, "solver"),
    ("compare models", lambda e: ct.compare(e["problem"], models=["resnet"]), ERROR, "models"),
    # --- issue 44: heads as torch gives them, raw exceptions of the API
    ("certify_network W1 strings", lambda e: ct.certify_network(e["problem"], dict(
        W1=[["a"] * 4], W2=np.ones((1, 3)), W3=np.ones((1, 2)))), ERROR, "network.W1"),
    ("certify_network W1 ragged", lambda e: ct.certify_network(e["problem"], dict(
        W1=[[0.5, 0.5], [1.0]], W2=np.ones((2, 3)), W3=np.ones((2, 2)))), ERROR, "network.W1"),
    ("certify_network W1 None", lambda e: ct.certify_network(e["problem"], dict(
        W1=None, W2=np.ones((1, 3)), W3=np.ones((1, 2)))), ERROR, "network.W1"),
    ("certify_network W2 a bool tensor", lambda e: ct.certify_network(e["problem"], dict(
        W1=np.full((1, 4), 0.25), W2=torch.ones(1, 3, dtype=torch.bool), W3=np.ones((1, 2)))), ERROR, "network.W2"),
    ("certify_network gated gate floats", lambda e: ct.certify_network(e["gated"], dict(
        W1=np.ones((1, 3, 3)), W2=np.ones((1, 3, 2)), gate=[0.5])), ERROR, "weights.gate"),
    ("nonconvex_objective dict keys", lambda e: ct.nonconvex_objective(e["problem"], {"W": 1}), ERROR, "weights"),
    ("nonconvex_objective W1 off the simplex", lambda e: ct.nonconvex_objective(e["problem"], dict(
        W1=torch.full((1, 4), 0.3), W2=np.ones((1, 3)), W3=np.ones((1, 2)))), ERROR, "weights.W1"),
    ("solve clarabel tol_gap_abs", lambda e: ct.solve(e["problem"], "clarabel", tol_gap_abs="x"), ERROR,
     "tol_gap_abs"),
    ("solve clarabel tol_feas None", lambda e: ct.solve(e["problem"], "clarabel", tol_feas=None), ERROR, "tol_feas"),
    ("solve scs eps_abs negative", lambda e: ct.solve(e["problem"], "scs", eps_abs=-1.0), ERROR, "eps_abs"),
    ("solve scs max_iters 1e30", lambda e: ct.solve(e["problem"], "scs", max_iters=10**30), ERROR, "max_iters"),
    ("solve verbose a string", lambda e: ct.solve(e["problem"], "clarabel", verbose="yes"), ERROR, "verbose"),
    ("solve screen a string", lambda e: ct.solve(e["problem"], "clarabel", screen="no"), ERROR, "screen"),
    ("solve fista working_set", lambda e: ct.solve(e["problem"], "fista", working_set="no"), ERROR, "working_set"),
    ("solve fista progress", lambda e: ct.solve(e["problem"], "fista", progress=None), ERROR, "progress"),
    ("solve tol 1e-320", lambda e: ct.solve(e["problem"], tol=1e-320), ERROR, "tol"),
    ("certify deadline a string", lambda e: ct.certify(e["problem"], e["Z"], deadline="soon"), ERROR, "deadline"),
    ("solve_path solver", lambda e: ct.solve_path(e["problem"], n_betas=3, solver="gurobi"), ERROR, "solver"),
    ("solve_path n_betas 1e30", lambda e: ct.solve_path(e["problem"], n_betas=10**30), ERROR, "n_betas"),
    ("solve_path progress", lambda e: ct.solve_path(e["problem"], n_betas=2, progress="yes"), ERROR, "progress"),
    ("beta_grid beta_max a string", lambda e: ct.beta_grid("1"), ERROR, "beta_max"),
    ("choose_solver options", lambda e: ct.choose_solver(e["problem"], options="fista"), ERROR, "options"),
    ("choose_solver tol", lambda e: ct.choose_solver(e["problem"], tol=None), ERROR, "tol"),
    ("compare models a number", lambda e: ct.compare(e["problem"], models=float("nan")), ERROR, "models"),
    ("compare heads inf", lambda e: ct.compare(e["problem"], heads=float("inf")), ERROR, "heads"),
    ("compare gates 1e30", lambda e: ct.compare(e["problem"], models="gated", gates=10**30), ERROR, "gates"),
    ("compare gates a 1-tuple", lambda e: ct.compare(e["problem"], models="gated", gates=(1,)), ERROR, "gates"),
    ("compare seed -1", lambda e: ct.compare(e["problem"], seed=-1), ERROR, "seed"),
    ("compare seed 2^64", lambda e: ct.compare(e["problem"], seed=2**64), ERROR, "seed"),
    ("train seed 2^64", lambda e: _trainer().train(_networks().AlternativeAttention(4, 3, 2, heads=1), e["X"],
                                                   e["y"], "squared", 1.0, steps=1, seed=2**64), ERROR, "seed"),
    ("compare gate_seed -1", lambda e: ct.compare(e["problem"], models="gated", gate_seed=-1), ERROR, "gate_seed"),
    ("compare sequence a string", lambda e: ct.compare(e["problem"], sequence="no"), ERROR, "sequence"),
    ("compare progress a string", lambda e: ct.compare(e["problem"], progress="no"), ERROR, "progress"),
    ("TokenStandardScaler with_mean", lambda e: _estimators().TokenStandardScaler(with_mean="no").fit(e["X"]), ERROR,
     "with_mean"),
]

CLI = [
    ("solve DATA a text file", ["solve", "{dir}/text.npz", *CORE, "--beta", "1"], "DATA"),
    ("solve DATA garbage X.npy", ["solve", "{dir}/garbage", *CORE, "--beta", "1"], "DATA"),
    ("solve DATA missing shard", ["solve", "{dir}/shards", *CORE, "--beta", "1"], "DATA"),
    ("solve X bool", ["solve", "{dir}/x_bool.npz", *CORE, "--beta", "1"], "X"),
    ("solve X strings", ["solve", "{dir}/x_str.npz", *CORE, "--beta", "1"], "X"),
    ("solve X of 1e300 --beta-frac", ["solve", "{dir}/x_1e300.npz", *CORE, "--beta-frac", "0.2"], "X"),
    ("solve label 1e9", ["solve", "{dir}/labels_1e9.npz", *CE, "--beta", "1"], "y"),
    ("solve --out is DATA", ["solve", "{dir}/data.npz", *CORE, "--beta", "1", "--out", "{dir}/data.npz"], "--out"),
    ("solve --out read-only", ["solve", "{dir}/data.npz", *CORE, "--beta", "1", "--out", "{dir}/read_only.npz"],
     "--out"),
    ("solve --solver", ["solve", "{dir}/data.npz", *CORE, "--beta", "1", "--solver", "gurobi"], "argument --solver"),
    ("verify beta a string", ["verify", "{dir}/data.npz", "{dir}/beta_str.npz", *CORE, "--beta", "1"], "RESULT: beta"),
    ("verify beta a vector", ["verify", "{dir}/data.npz", "{dir}/beta_vector.npz", *CORE, "--beta", "1"],
     "RESULT: beta"),
    ("verify Z of 1e200", ["verify", "{dir}/data.npz", "{dir}/z_1e200.npz", *CORE, "--beta", "1"], "RESULT: Z"),
    ("verify Z complex", ["verify", "{dir}/data.npz", "{dir}/z_complex.npz", *CORE, "--beta", "1"], "RESULT: Z"),
    ("verify V complex", ["verify", "{dir}/data.npz", "{dir}/v_complex.npz", *CORE, "--beta", "1"], "RESULT: V"),
    ("verify RESULT a text file", ["verify", "{dir}/data.npz", "{dir}/text.npz", *CORE, "--beta", "1"], "RESULT"),
    ("demo --tol", ["demo", "--tol", "2"], "argument --tol"),
    ("compare DATA a text file", ["compare", "{dir}/text.npz", *CORE, "--beta", "1", "--out-dir", "{dir}/out"],
     "DATA"),
    ("compare --out-dir a file", ["compare", "{dir}/data.npz", *CORE, "--beta", "1", "--out-dir", "{dir}/a_file"],
     "--out-dir"),
    ("bert-data --out read-only", ["bert-data", "--layer", "1", "--n-tokens", "8", "--samples", "8", "--out",
                                   "{dir}/read_only.npz"], "--out"),
    ("energy --out-dir a file", ["energy", "--model", "unfolded", "--out-dir", "{dir}/a_file"], "--out-dir"),
    ("grok --out-dir a file", ["grok", "--quick", "--out-dir", "{dir}/a_file"], "--out-dir"),
    ("grok-suite --settings", ["grok-suite", "--settings", "97:x", "--out-dir", "{dir}/out"], "--settings"),
    ("grok-ladder --out-dir a file", ["grok-ladder", "--out-dir", "{dir}/a_file"], "--out-dir"),
    ("grok-gates --teacher", ["grok-gates", "--teacher", "{dir}/shards", "--out-dir", "{dir}/out"], "--teacher"),
    ("kernel --out-dir a file", ["kernel", "--out-dir", "{dir}/a_file/sub"], "--out-dir"),
    ("spectral --out-dir a file", ["spectral", "--out-dir", "{dir}/a_file"], "--out-dir"),
    ("solve gated --gates 0", ["solve", "{dir}/data.npz", "--program", "gated_mhsa", "--loss", "squared", "--beta",
                               "1", "--gates", "0"], "argument --gates"),
    ("verify gated Z complex", ["verify", "{dir}/data.npz", "{dir}/z_complex.npz", "--program", "gated_mhsa",
                                "--loss", "squared", "--beta", "1"], "RESULT: Z"),
    ("compare --solver", ["compare", "{dir}/data.npz", *CORE, "--beta", "1", "--solver", "gurobi", "--out-dir",
                          "{dir}/out"], "argument --solver"),
    # --- issue 44
    ("verify fingerprint rows 1e400", ["verify", "{dir}/data.npz", "{dir}/fingerprint_1e400.npz", *CORE, "--beta", "1"],
     "RESULT"),
    ("verify fingerprint nested", ["verify", "{dir}/data.npz", "{dir}/fingerprint_nested.npz", *CORE, "--beta", "1"],
     "RESULT"),
    ("solve --tol 1e-320", ["solve", "{dir}/data.npz", *CORE, "--beta", "1", "--tol", "1e-320"], "argument --tol"),
    ("compare --seed 2^64", ["compare", "{dir}/data.npz", *CORE, "--beta", "1", "--seed", str(2**64), "--out-dir",
                             "{dir}/out"], "argument --seed"),
    ("demo --seed -1", ["demo", "--seed", "-1"], "argument --seed"),
    ("compare --tol 1e-16", ["compare", "{dir}/data.npz", *CORE, "--beta", "1", "--tol", "1e-16", "--out-dir",
                             "{dir}/out"], "argument --tol"),
    ("solve a .npz and a folder", ["solve", "{dir}/data.npz", "{dir}/shards/s0", *CORE, "--beta", "1"],
     r"DATA: '[^']*data.npz' is a file, and several DATA must all be shard folders"),
]


def _builders():
    from cvxtransformer.core import cvxpy_builders
    return cvxpy_builders


def _open_data(path):
    from cvxtransformer.core.data import open_data
    return open_data(str(path))


def _datasets():
    from cvxtransformer import datasets
    return datasets


def _networks():
    from cvxtransformer.nn import networks
    return networks


def _trainer():
    from cvxtransformer.nn import trainer
    return trainer


def _estimators():
    from cvxtransformer import estimators  # MissingDependencyError without scikit-learn: the row is skipped
    return estimators


@pytest.mark.parametrize("call, error, name", [row[1:] for row in API], ids=[row[0] for row in API])
def test_the_python_api_names_the_argument(env, call, error, name):
    before = snapshot(env["dir"])
    try:
        with pytest.raises(error) as info:
            call(env)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    message = str(info.value)
    assert message.startswith(f"{name}: ") or message.startswith(f"{name} "), message
    assert "\n" not in message and snapshot(env["dir"]) == before


@pytest.mark.parametrize("argv, name", [row[1:] for row in CLI], ids=[row[0] for row in CLI])
def test_the_command_line_names_the_argument(env, capsys, argv, name):
    before = snapshot(env["dir"])
    argv = [a.format(dir=env["dir"]) for a in argv]
    code = main(argv)
    out, err = capsys.readouterr()
    command = argv[0]
    assert_one_line_error(code, err, command, rf"^cvxtransformer {command}: error: {name}\b")
    assert "Traceback" not in err and out == "" and snapshot(env["dir"]) == before
    assert not os.path.exists(env["dir"] / "out")


# ----------------------------------------------------------------------------- not errors, but said
def test_verify_says_which_gates_it_certifies_with(tmp_path, capsys):
    """RESULT's gates (those Z was solved with) are used; when DATA holds other gates a note on stderr
    says so (a RESULT without data fingerprint; with one, other gates in DATA are refused: issue #33),
    and ``--json`` names the source (``gates``)."""
    import json

    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal((30, 2))
    U1, U2 = rng.standard_normal((3, 4)), rng.standard_normal((3, 3))
    np.savez(tmp_path / "gated.npz", X=X, y=y, U1=U1, U2=U2)
    np.savez(tmp_path / "plain.npz", X=X, y=y)
    args = ["--program", "12", "--loss", "squared", "--beta-frac", "0.3", "--gates", "3", "--json"]
    assert main(["solve", str(tmp_path / "plain.npz"), *args, "--out", str(tmp_path / "r.npz")]) == 0  # sampled gates
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "gated.npz"), str(tmp_path / "r.npz"), *args]) == 2
    assert "RESULT: it was solved with other gates: U1, U2 (DATA) differ" in capsys.readouterr().err
    np.savez(tmp_path / "r.npz", **{k: v for k, v in np.load(tmp_path / "r.npz").items() if k != "fingerprint"})
    for data, source, note in (("gated.npz", "RESULT", True), ("plain.npz", "RESULT", False)):
        main(["verify", str(tmp_path / data), str(tmp_path / "r.npz"), *args])
        out, err = capsys.readouterr()
        assert json.loads(out)["gates"] == source and json.loads(out)["certified"]
        assert ("cvxtransformer verify: note: RESULT's gates U1, U2 differ from DATA's; certifying with RESULT's "
                "(the gates Z was solved with)" in err.splitlines()) == note, err
    np.savez(tmp_path / "z_only.npz", Z=np.load(tmp_path / "r.npz")["Z"])
    main(["verify", str(tmp_path / "gated.npz"), str(tmp_path / "z_only.npz"), *args])
    assert json.loads(capsys.readouterr().out)["gates"] == "DATA"
    main(["verify", str(tmp_path / "plain.npz"), str(tmp_path / "z_only.npz"), *args])
    assert json.loads(capsys.readouterr().out)["gates"] == "sampled (--gates 3 --gate-seed 0)"


def test_one_hot_targets_are_built_without_an_identity_matrix():
    """A label of 49,999 on two samples: the targets are 2 x 50,000 (np.eye(50,000) would be 20 GB)."""
    from cvxtransformer.core.losses import CrossEntropyLoss

    T = CrossEntropyLoss().encode(np.array([0, 49_999]))
    assert T.shape == (2, 50_000) and T.sum() == 2 and T[1, 49_999] == 1 and T[0, 0] == 1
