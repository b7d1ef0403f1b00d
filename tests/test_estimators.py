"""The scikit-learn estimators (docs/estimators.md): against the functional API and independent
formulas, inside GridSearchCV over beta, their errors, and scikit-learn's estimator checks."""
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError

pytest.importorskip("sklearn", reason="the estimators need the optional extra: pip install 'cvxtransformer[sklearn]'")

from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning, NotFittedError  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

from cvxtransformer import estimators  # noqa: E402
from cvxtransformer.estimators import (AttentionClassifier, AttentionRegressor, ConvexClassifier,  # noqa: E402
                                       ConvexRegressor, GatedMHSAClassifier, GatedMHSARegressor, MHSAClassifier,
                                       MHSARegressor, MixerClassifier, MixerRegressor)


# ----------------------------------------------------------------------------- independent formulas
def reference_outputs(program, X, Z, gates=None):
    """yhat (N, n_outputs) from the formulas of docs/conventions.md, sample by sample in einsum."""
    if program == 8:
        return np.einsum("ikd,kd->i", X, Z)[:, None]
    if program == 10:
        return np.einsum("ikd,lkd->il", X, Z)
    if program == 12:
        U1, U2 = gates
        M = (np.einsum("jk,ikd,jd->ij", U1, X, U2) >= 0).astype(float)
        return np.einsum("ij,ikd,jlkd->il", M, X, Z)
    raise ValueError(program)


def reference_mhsa(X, Z, pooled):
    """Yhat_i = sum_{k,l} G_i[k, l] X_i Z^{(k,l)}, Z^{(k,l)} = Z[k d:(k+1) d, l c:(l+1) c]: (N, n, c), or
    (N, c) pooled (mean over tokens)."""
    d = X.shape[2]
    c = Z.shape[1] // d
    G = np.einsum("ita,itb->iab", X, X)
    Y = np.einsum("ikl,ita,kalb->itb", G, X, Z.reshape(d, d, d, c))
    return Y.mean(axis=1) if pooled else Y


def reference_gates(h, n, d, seed):
    rng = np.random.default_rng(seed)  # docs/conventions.md: U1 (h, n), U2 (h, d), i.i.d. N(0, 1)
    return rng.standard_normal((h, n)), rng.standard_normal((h, d))


def r2(y, pred):
    """R^2 averaged over outputs (scikit-learn's uniform average), written out."""
    y, pred = y.reshape(len(y), -1), pred.reshape(len(pred), -1)
    return float(np.mean(1 - ((y - pred) ** 2).sum(0) / ((y - y.mean(0)) ** 2).sum(0)))


def functional(X, y, program, loss, frac, **kw):
    """The functional API's solution at beta = frac * beta_max."""
    problem = ct.make_problem(X, y, program=program, loss=loss, beta=1.0, **kw)
    problem = problem.with_beta(frac * problem.beta_max())
    return problem, ct.solve(problem)


# ----------------------------------------------------------------------------- regressors
@pytest.mark.parametrize("program, target", [(8, "scalar"), (10, "vector"), (10, "sequence"), (12, "vector"),
                                             ("mhsa", "vector"), ("mhsa", "sequence")])
def test_regressor_matches_the_functional_api(program, target):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 4, 3))
    if program == "mhsa":  # a linear MHSA teacher with one head: Z = u v^T of shape (d^2, d c)
        y = reference_mhsa(X, np.outer(rng.standard_normal(9), rng.standard_normal(6)), pooled=target == "vector")
    else:
        signal = np.einsum("ikd,kd->i", X, rng.standard_normal((4, 3)))
        y = {"scalar": signal, "vector": np.column_stack([signal, -signal]),
             "sequence": X[:, :, :2] + 0.1 * rng.standard_normal((50, 4, 2))}[target]
    y = y + 0.05 * y.std() * rng.standard_normal(y.shape)
    Xtr, ytr, Xte, yte = X[:35], y[:35], X[35:], y[35:]
    if program == "mhsa":
        model = MHSARegressor(beta_frac=0.05)
    else:
        model = AttentionRegressor(program=program, beta_frac=0.05, gates=4, gate_seed=3)
    assert model.fit(Xtr, ytr) is model
    problem, ref = functional(Xtr, ytr, program, "squared", 0.05, gates=4, gate_seed=3)
    np.testing.assert_allclose(model.coef_, ref.Z, rtol=0, atol=1e-12)
    assert model.coef_.shape == problem.program.shape
    assert model.beta_max_ == pytest.approx(problem.beta_max(), rel=1e-14)
    assert model.beta_ == pytest.approx(0.05 * problem.beta_max(), rel=1e-14)
    assert model.dual_gap_ == pytest.approx(ref.certificate.duality_gap, rel=1e-6, abs=1e-12)
    assert model.certificate_.certified and model.certificate_.relative_gap <= 1e-6
    assert model.n_iter_ == ref.iterations and model.n_iter_ > 0

    pred = model.predict(Xte)
    assert pred.shape == yte.shape
    if program == "mhsa":
        expected = reference_mhsa(Xte, model.coef_, pooled=target != "sequence")
    else:
        gates = reference_gates(4, 4, 3, 3) if program == 12 else None
        expected = reference_outputs(program, Xte, model.coef_, gates).reshape(yte.shape)
    np.testing.assert_allclose(pred, expected, rtol=1e-10, atol=1e-10)
    assert model.score(Xte, yte) == pytest.approx(r2(yte, expected), rel=1e-10)
    assert model.score(Xte, yte) > 0.5  # the teacher is found


def reference_mixer(X, Z, G, pooled):
    """The token-mixing network's outputs written out (docs/mixer.md): f(X_i)[:, a] = sum_g D_g(i, a) Z_g x_ia
    with D_g(i, a) = 1[G_g . x_ia >= 0]; (N, n_out, d) per channel, or averaged over the channels."""
    D = (np.einsum("gt,ita->iga", G, X) >= 0).astype(float)
    f = np.einsum("iga,got,ita->ioa", D, Z, X)
    return f.mean(axis=2) if pooled else f


@pytest.mark.parametrize("pooled", [False, True])
def test_mixer_regressor_matches_the_functional_api_and_the_written_out_network(pooled):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((50, 4, 3))
    G = rng.standard_normal((1, 4))  # a one-gate teacher
    y = reference_mixer(X, rng.standard_normal((1, 2, 4)), G, pooled)
    y = y + 0.05 * y.std() * rng.standard_normal(y.shape)
    model = MixerRegressor(gates=3, gate_seed=2, beta_frac=0.05).fit(X[:35], y[:35])
    problem, ref = functional(X[:35], y[:35], "mixer", "squared", 0.05, gates=3, gate_seed=2)
    np.testing.assert_allclose(model.coef_, ref.Z, rtol=0, atol=1e-12)
    assert model.coef_.shape == (3, 2, 4) and model.certificate_.certified
    G_fit = np.random.default_rng(2).standard_normal((3, 4))  # make_problem's gates: N(0, 1) from gate_seed
    expected = reference_mixer(X[35:], model.coef_, G_fit, pooled)
    np.testing.assert_allclose(model.predict(X[35:]), expected, rtol=1e-10, atol=1e-10)
    assert model.score(X[35:], y[35:]) == pytest.approx(r2(y[35:], expected), rel=1e-10)
    generic = ConvexRegressor(program="mixer", gates=3, gate_seed=2, beta_frac=0.05).fit(X[:35], y[:35])
    np.testing.assert_array_equal(generic.coef_, model.coef_)  # the thin subclass is the generic estimator


def test_mixer_classifier_and_the_generic_classifier_agree():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((60, 4, 3))
    labels = np.array(["a", "b", "c"])[np.argmax(reference_mixer(X, rng.standard_normal((1, 3, 4)),
                                                                 rng.standard_normal((1, 4)), True), axis=1)]
    model = MixerClassifier(gates=2, beta_frac=0.05).fit(X[:45], labels[:45])
    generic = ConvexClassifier(program="mixer", gates=2, beta_frac=0.05).fit(X[:45], labels[:45])
    np.testing.assert_array_equal(model.coef_, generic.coef_)
    np.testing.assert_array_equal(model.classes_, ["a", "b", "c"])
    G_fit = np.random.default_rng(0).standard_normal((2, 4))
    out = reference_mixer(X[45:], model.coef_, G_fit, True)
    np.testing.assert_array_equal(model.predict(X[45:]), model.classes_[np.argmax(out, axis=1)])
    e = np.exp(out - out.max(1, keepdims=True))
    np.testing.assert_allclose(model.predict_proba(X[45:]), e / e.sum(1, keepdims=True), rtol=1e-10)


def test_the_estimators_take_registered_programs_only():
    X = np.random.default_rng(0).standard_normal((10, 3, 2))
    with pytest.raises(InvalidInputError, match=r"^program: expected one of 8, 10, 12, '10wd', '12wd', 'mhsa', 'gated_mhsa', 'mixer'"):
        ConvexRegressor(program="nope").fit(X, X[:, 0, :1])
    with pytest.raises(InvalidInputError, match=r"use MixerRegressor or MixerClassifier for 'mixer'"):
        AttentionRegressor(program="mixer").fit(X, X[:, :1, :])


def test_mhsa_predicts_on_another_number_of_tokens():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((30, 4, 3))
    model = MHSARegressor(beta_frac=0.1).fit(X, X[:, :, :2])
    X6 = rng.standard_normal((5, 6, 3))
    np.testing.assert_allclose(model.predict(X6), reference_mhsa(X6, model.coef_, pooled=False), rtol=1e-10,
                               atol=1e-12)
    assert model.predict(X6).shape == (5, 6, 2)


# ----------------------------------------------------------------------------- classifiers
@pytest.mark.parametrize("make, labels", [
    (lambda: AttentionClassifier(program=10, beta_frac=0.05), np.array(["ant", "bee", "cat"])),
    (lambda: AttentionClassifier(program=12, beta_frac=0.05, gates=3, gate_seed=1), np.array([10, 20, 30])),
    (lambda: AttentionClassifier(program=8, loss="logistic", beta_frac=0.05), np.array([0, 1])),
    (lambda: AttentionClassifier(program=10, loss="logistic", beta_frac=0.05), np.array(["no", "yes"])),
    (lambda: MHSAClassifier(beta_frac=0.05), np.array([3, 5, 9])),
    (lambda: MHSAClassifier(loss="logistic", beta_frac=0.05), np.array([False, True])),
])
def test_classifier_maps_labels_and_matches_the_functional_api(make, labels):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, 4, 3))
    model = make()
    if isinstance(model, MHSAClassifier):  # labels from a linear MHSA teacher, or from linear attention
        scores = reference_mhsa(X, rng.standard_normal((9, 3 * len(labels))), pooled=True)
    else:
        scores = np.einsum("ikd,lkd->il", X, rng.standard_normal((len(labels), 4, 3)))
    y = labels[np.argmax(scores, axis=1)]
    Xtr, ytr, Xte, yte = X[:45], y[:45], X[45:], y[45:]
    assert model.fit(Xtr, ytr) is model
    np.testing.assert_array_equal(model.classes_, np.sort(labels))
    # the encoding of docs/estimators.md: classes_[k] -> k (cross-entropy), classes_[0] -> -1, classes_[1] -> +1
    encoded = np.searchsorted(model.classes_, ytr)
    program = "mhsa" if isinstance(model, MHSAClassifier) else model.program
    if model.loss == "logistic":
        encoded = 2.0 * encoded - 1.0
    problem, ref = functional(Xtr, encoded, program, model.loss, 0.05, gates=3, gate_seed=1)
    np.testing.assert_allclose(model.coef_, ref.Z, rtol=0, atol=1e-12)
    assert model.certificate_.certified

    if program == "mhsa":
        out = reference_mhsa(Xte, model.coef_, pooled=True)
    else:
        out = reference_outputs(program, Xte, model.coef_, reference_gates(3, 4, 3, 1) if program == 12 else None)
    if model.loss == "logistic":
        p1 = 1 / (1 + np.exp(-out[:, 0]))
        proba, predicted = np.column_stack([1 - p1, p1]), model.classes_[(out[:, 0] >= 0).astype(int)]
        np.testing.assert_allclose(model.decision_function(Xte), out[:, 0], rtol=1e-10, atol=1e-12)
    else:
        e = np.exp(out - out.max(1, keepdims=True))
        proba, predicted = e / e.sum(1, keepdims=True), model.classes_[np.argmax(out, 1)]
    np.testing.assert_allclose(model.predict_proba(Xte), proba, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(model.predict(Xte), predicted)
    assert model.score(Xte, yte) == pytest.approx(np.mean(predicted == yte))
    assert model.score(Xtr, ytr) >= 0.8  # the labels come from a linear teacher


# ----------------------------------------------------------------------------- GridSearchCV
@pytest.mark.slow
def test_grid_search_over_beta_matches_a_loop_over_the_functional_api():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((48, 4, 3))
    y = np.einsum("ikd,lkd->il", X, rng.standard_normal((2, 4, 3)) * (rng.random((2, 4, 1)) < 0.4))
    y = y + 0.5 * rng.standard_normal(y.shape)
    beta_max = ct.make_problem(X, y, program=10, beta=1.0).beta_max()
    betas = [0.01 * beta_max, 0.1 * beta_max, 0.6 * beta_max]
    folds = KFold(n_splits=3, shuffle=True, random_state=0)
    search = GridSearchCV(AttentionRegressor(program=10), {"beta": betas}, cv=folds).fit(X, y)

    expected = []
    for beta in betas:
        scores = []
        for train, test in folds.split(X):
            problem = ct.make_problem(X[train], y[train], program=10, beta=beta)
            Z = ct.solve(problem).Z
            scores.append(r2(y[test], reference_outputs(10, X[test], Z)))
        expected.append(np.mean(scores))
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected, rtol=1e-9)
    assert search.best_params_ == {"beta": betas[int(np.argmax(expected))]}
    best = ct.solve(ct.make_problem(X, y, program=10, beta=search.best_params_["beta"]))
    np.testing.assert_allclose(search.best_estimator_.coef_, best.Z, rtol=0, atol=1e-12)


def test_the_default_solver_is_auto_and_solver_names_the_one_that_ran(monkeypatch):
    """As ``ct.solve``: Clarabel on a small problem, the torch backend past ``AUTO_COEFFICIENTS``;
    both fits certified and equal to the named solvers' fits."""
    from cvxtransformer import solving
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((60, 3, 2)), rng.choice([-1.0, 1.0], 60)
    small = AttentionClassifier(program=8, loss="logistic", beta_frac=0.2).fit(X, y)
    assert small.solver == "auto" and small.solver_ == "clarabel" and small.certificate_.certified
    monkeypatch.setattr(solving, "AUTO_COEFFICIENTS", 0)
    large = AttentionClassifier(program=8, loss="logistic", beta_frac=0.2).fit(X, y)
    assert large.solver_ == "fista" and large.certificate_.certified
    named = AttentionClassifier(program=8, loss="logistic", beta_frac=0.2, solver="fista").fit(X, y)
    np.testing.assert_array_equal(large.coef_, named.coef_)
    np.testing.assert_allclose(large.coef_, small.coef_, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- parameters and errors
def test_init_stores_parameters_only_and_params_round_trip():
    model = AttentionClassifier(program="bogus", loss="hinge", tol=5, beta=-1)  # validated in fit, not here
    assert model.get_params() == {"program": "bogus", "loss": "hinge", "beta": -1, "beta_frac": None, "gates": 8,
                                  "gate_seed": 0, "solver": "auto", "tol": 5, "refine": "auto"}
    assert model.set_params(program=12, loss="logistic", tol=1e-4) is model
    assert (model.program, model.loss, model.tol) == (12, "logistic", 1e-4)
    copy = clone(model)
    assert copy.get_params() == model.get_params() and not hasattr(copy, "coef_")
    assert set(MHSARegressor().get_params()) == {"beta", "beta_frac", "solver", "tol", "refine"}


@pytest.mark.parametrize("model, y_kind, match", [
    (AttentionRegressor(tol=0), "real", r"tol: expected a relative gap in \(0, 1\)"),
    (AttentionRegressor(tol=5), "real", r"tol: expected a relative gap in \(0, 1\)"),
    (AttentionRegressor(tol=float("nan")), "real", r"tol: expected a relative gap"),
    (AttentionRegressor(beta=-1.0), "real", r"beta: expected a finite number > 0, got -1.0"),
    (AttentionRegressor(beta_frac=0), "real", r"beta_frac: expected a finite number > 0"),
    (AttentionRegressor(beta=1.0, beta_frac=0.1), "real", r"beta, beta_frac: expected exactly one of them, got both"),
    (AttentionRegressor(program=9), "real",
     r"program: expected one of 8, 10, 12, '10wd', '12wd', 'mhsa', 'gated_mhsa', 'mixer', got 9"),
    (AttentionRegressor(program="mhsa"), "real", r"use MHSARegressor or MHSAClassifier"),
    (AttentionRegressor(solver="mosek"), "real", r"solver: expected 'auto' or one of \['clarabel', 'fista', 'scs'\], got 'mosek'"),
    (AttentionRegressor(refine="sometimes"), "real", r"refine: expected True, False or 'auto'"),
    (AttentionRegressor(program=12, gates=0), "real", r"gates: expected an integer >= 1, got 0"),
    (AttentionRegressor(program=8), "vector", r"y: expected shape \(N,\) for program \(8\)"),
    (AttentionRegressor(), "text", r"y: expected real targets, got non-numeric values"),
    (AttentionClassifier(loss="squared"), "labels", r"loss: expected one of 'logistic', 'cross_entropy'"),
    (AttentionClassifier(program=8), "labels", r"loss: expected one of \('squared', 'logistic'\) for program \(8\)"),
    (AttentionClassifier(loss="logistic"), "labels", r"y: expected 2 classes for the logistic loss, got 3 classes"),
    (AttentionClassifier(), "one class", r"y: expected at least 2 classes, got 1 class"),
    (AttentionClassifier(), "real", r"y: expected class labels, got continuous values"),
    (AttentionClassifier(), "column", r"y: expected labels of shape \(N,\), got shape \(20, 1\)"),
    (MHSAClassifier(), "nan", r"y: expected finite labels, got NaN/Inf entries"),
])
def test_fit_errors_name_the_parameter_and_the_fix(model, y_kind, match):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3, 2))
    y = {"real": rng.standard_normal(20), "vector": rng.standard_normal((20, 2)),
         "text": np.array(["a"] * 20, dtype=object), "labels": np.arange(20) % 3, "one class": np.zeros(20, int),
         "column": (np.arange(20) % 2)[:, None], "nan": np.r_[np.nan, np.zeros(19)]}[y_kind]
    with pytest.raises(InvalidInputError, match=match):
        model.fit(X, y)
    assert not hasattr(model, "coef_")


def test_x_is_checked_in_fit_and_predict():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 3, 2))
    model = AttentionRegressor()
    with pytest.raises(NotFittedError):
        model.predict(X)
    with pytest.raises(InvalidInputError, match=r"X: expected shape \(N, n, d\), got shape \(20, 6\)"):
        model.fit(X.reshape(20, 6), X[:, 0, 0])
    with pytest.raises(InvalidInputError, match="X: expected real numbers, got complex values"):
        model.fit(X + 1j, X[:, 0, 0])
    model.fit(X, X[:, 0, :])
    with pytest.raises(InvalidInputError, match=r"X: expected shape \(N, 3, 2\), as in fit, got shape \(4, 5, 2\)"):
        model.predict(rng.standard_normal((4, 5, 2)))
    with pytest.raises(InvalidInputError, match="X: expected finite values"):
        model.predict(np.full((4, 3, 2), np.nan))
    mhsa = MHSARegressor().fit(X, X[:, 0, :])
    with pytest.raises(InvalidInputError, match=r"X: expected tokens of dimension d = 2, as in fit"):
        mhsa.predict(rng.standard_normal((4, 3, 5)))


def test_an_uncertified_fit_warns_with_its_gap(monkeypatch):
    """A solve stopped after 2 iterations (a real early stop, not a fake result) must warn."""
    real_solve = estimators.solve
    monkeypatch.setattr(estimators, "solve", lambda *a, **k: real_solve(*a, max_iter=2, **k))
    X = np.random.default_rng(0).standard_normal((30, 4, 3))
    model = AttentionRegressor(beta_frac=0.1, refine=False)
    with pytest.warns(ConvergenceWarning, match=r"relative duality gap .* is above tol 1.0e-06 .* not certified"):
        model.fit(X, X[:, 1, :2])
    assert not model.certificate_.certified and model.certificate_.relative_gap > 1e-6
    assert model.dual_gap_ == model.certificate_.duality_gap > 0


def test_beta_at_or_above_beta_max_gives_zero_without_a_solve():
    X = np.random.default_rng(0).standard_normal((20, 3, 2))
    model = AttentionRegressor(beta_frac=1.0).fit(X, X[:, 0, :])
    assert not model.coef_.any() and model.n_iter_ == 0 and model.certificate_.certified


# ----------------------------------------------------------------------------- packaging
@pytest.mark.slow
def test_scikit_learn_stays_optional():
    """Importing and using the package imports no scikit-learn; without it, the estimators say what to install."""
    code = ("import sys\n"
            "import cvxtransformer as ct\n"
            "import cvxtransformer.solving, cvxtransformer.verify, cvxtransformer.path, cvxtransformer.cli\n"
            "ct.make_problem, ct.solve, ct.certify, ct.solve_path\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'sklearn': raise ImportError('no sklearn here')\n"
            "sys.meta_path.insert(0, Block())\n"
            "try:\n"
            "    ct.AttentionRegressor\n"
            "except ct.MissingDependencyError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "[]", "cvxtransformer.estimators needs scikit-learn; pip install 'cvxtransformer[sklearn]'"]


def test_exported_lazily():
    for name in estimators.__all__:
        assert getattr(ct, name) is getattr(estimators, name) and name in ct.__all__


def test_the_families_estimators_are_built_from_the_registry(monkeypatch):
    """Each family's ``<prefix>Regressor``/``<prefix>Classifier`` comes from its ``Family.estimator``: one class,
    kept in the module (pickle and clone find it by name), with the gated or the plain parameters."""
    import pickle

    from cvxtransformer.core import registry
    from cvxtransformer.core.attention import AttentionProgram, Proposition1

    fams = registry.families()
    assert sorted(registry.estimator_names()) == sorted(
        f"{p}{r}" for p in ("MHSA", "GatedMHSA", "Mixer") for r in ("Regressor", "Classifier"))
    for name in registry.estimator_names():
        cls = getattr(estimators, name)
        assert cls.__module__ == "cvxtransformer.estimators" and cls.__qualname__ == name and name in dir(estimators)
        assert pickle.loads(pickle.dumps(cls)) is cls and cls._programs[0] in fams
        gated = "gates" in fams[cls._programs[0]].options
        assert ("gates" in cls().get_params()) == gated == ("gate_seed : int" in cls.__doc__)
        assert ("loss" in cls().get_params()) == name.endswith("Classifier")
    X = np.random.default_rng(0).standard_normal((12, 3, 2))
    fitted = MixerRegressor(gates=2, beta_frac=0.2).fit(X, X[:, :1, :])
    copy = pickle.loads(pickle.dumps(fitted))
    assert type(copy) is MixerRegressor and type(clone(fitted)) is MixerRegressor
    np.testing.assert_array_equal(copy.predict(X), fitted.predict(X))
    # a family registered by a user gets its estimators the same way
    monkeypatch.setattr(registry, "_FAMILIES", dict(fams))
    with pytest.raises(InvalidInputError, match=r"^estimator: expected \(prefix, title\) or"):
        registry.register("toy", AttentionProgram, Proposition1, ("squared",), estimator=("not a name", "Toy"))
    registry.register("toy", AttentionProgram, Proposition1, ("squared", "logistic"), estimator=("Toy", "Toy program"))
    try:
        toy = estimators.ToyRegressor
        assert toy._programs == ("toy",) and toy.__doc__.startswith('Toy program (``"toy"``), squared loss.')
        assert set(toy().get_params()) == {"beta", "beta_frac", "solver", "tol", "refine"}
        assert "ToyClassifier" in estimators.__all__ and "ToyRegressor" in dir(estimators)
    finally:
        for name in ("ToyRegressor", "ToyClassifier"):
            estimators.__dict__.pop(name, None)
    with pytest.raises(AttributeError, match="has no attribute 'NopeRegressor'"):
        estimators.NopeRegressor


# ----------------------------------------------------------------------------- scikit-learn's checks
# The estimators declare 3-d X (tags: two_d_array=False, three_d_array=True), so check_estimator
# runs no check on them directly (it warns that it cannot). Below: (1) the checks that need no
# data, run on the estimators themselves; (2) the whole suite on a one-token view of each
# estimator, a subclass that reads scikit-learn's 2-d X (N, d) as N sequences of one token
# (N, 1, d) and changes nothing else: every fit, predict, error and attribute is the estimator's own.
def one_token(X):
    if hasattr(X, "toarray"):  # scipy sparse: passed on, for the estimator to refuse
        return X
    X = X if isinstance(X, np.ndarray) else np.asarray(X)  # lists, pandas frames (memory maps are kept)
    return X.reshape(X.shape[0], 1, -1) if X.ndim == 2 else X


class _OneToken:
    def fit(self, X, y):
        return super().fit(one_token(X), y)

    def predict(self, X):
        return super().predict(one_token(X))

    def score(self, X, y, sample_weight=None):
        return super().score(one_token(X), y, sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array, tags.input_tags.three_d_array = True, False
        return tags


class _OneTokenClassifier(_OneToken):
    def predict_proba(self, X):
        return super().predict_proba(one_token(X))

    def decision_function(self, X):
        return super().decision_function(one_token(X))


class OneTokenAttentionRegressor(_OneToken, AttentionRegressor):
    pass


class OneTokenAttentionClassifier(_OneTokenClassifier, AttentionClassifier):
    pass


class OneTokenMHSARegressor(_OneToken, MHSARegressor):
    pass


class OneTokenMHSAClassifier(_OneTokenClassifier, MHSAClassifier):
    pass


class OneTokenMixerRegressor(_OneToken, MixerRegressor):
    pass


class OneTokenMixerClassifier(_OneTokenClassifier, MixerClassifier):
    pass


# check name -> (why it cannot pass, a pattern of the failure it must fail with); docs/estimators.md
CANNOT_APPLY = {
    "check_complex_data": ("matches scikit-learn's own wording 'Complex data not supported'",
                           "Got X: expected real numbers, got complex values"),
    "check_estimators_empty_data_messages": ("matches scikit-learn's wording '0 feature(s) (shape=(12, 0))...'",
                                             r"Got X: expected non-empty shape \(N, n, d\), got shape \(12, 1, 0\)"),
    "check_fit2d_predict1d": ("matches scikit-learn's wording 'Reshape your data'",
                              r"Got X: expected shape \(N, n, d\), got shape \(3,\)"),
    "check_dtype_object": ("wants a TypeError for X holding a dict; ours is an InvalidInputError (a ValueError)",
                           r"X: expected a numeric array of shape \(N, n, d\)"),
    "check_n_features_in": ("n_features_in_ is the column count of a 2-d X; X here is (N, n, d)", r"^$"),
    "check_n_features_in_after_fitting": ("n_features_in_ is the column count of a 2-d X; X here is (N, n, d)",
                                          r"does not set the `n_features_in_` attribute"),
    "check_requires_y_none": ("matches scikit-learn's wording 'requires y to be passed, but the target y is None'",
                              r"y: expected targets, one per sample of X, got None; pass y to fit"),
    # classifiers with the logistic loss, and program (8) (scalar output) only:
    "check_classifier_not_supporting_multiclass": (
        "matches scikit-learn's wording 'Only binary classification is supported.'",
        r"y: expected 2 classes for the logistic loss, got 3 classes; use the cross_entropy loss"),
    "check_supervised_y_2d": ("a column y (N, 1) is refused with a message instead of raveled with a warning "
                              "(classifiers, and program (8), whose output is a scalar)",
                              r"y: expected (labels of shape \(N,\)|shape \(N,\) for program \(8\) \(scalar "
                              r"output\)), got shape \(\d+, 1\)"),
    # the token-mixing program only: its weights are shared over the channels, so on one token its output is a
    # gated sum over the features of one function of each (sum_a phi(x_a)): it cannot weigh the features apart,
    # and misses the accuracy these checks want on their data (the assertion has no message)
    "check_regressors_train": ("the token-mixing program on one token is a sum over the features of one function "
                               "of each, which cannot fit the check's linear data", r"^$"),
    "check_classifiers_train": ("the token-mixing program on one token is a sum over the features of one function "
                                "of each, which cannot separate the check's blobs", r"^$"),
}


OPTIONAL_SKIP = re.compile(r"^(pandas|polars|pyarrow) is not installed")


def cannot_apply(model):
    """The checks of CANNOT_APPLY that this model runs and fails."""
    classifier, scalar = isinstance(model, _OneTokenClassifier), getattr(model, "program", None) == 8
    skip = set() if classifier or scalar else {"check_supervised_y_2d"}
    if getattr(model, "loss", None) != "logistic":
        skip.add("check_classifier_not_supporting_multiclass")
    if not isinstance(model, MixerRegressor | MixerClassifier):
        skip |= {"check_regressors_train", "check_classifiers_train"}
    return {k: v for k, v in CANNOT_APPLY.items() if k not in skip}


@pytest.mark.parametrize("model", [AttentionRegressor(), AttentionClassifier(), MHSARegressor(), MHSAClassifier(),
                                   GatedMHSARegressor(), GatedMHSAClassifier(), MixerRegressor(), MixerClassifier(),
                                   ConvexRegressor(), ConvexClassifier()], ids=lambda m: type(m).__name__)
def test_checks_that_need_no_data_pass_on_the_estimators(model):
    from sklearn.utils import estimator_checks as ec

    name = type(model).__name__
    for check in (ec.check_estimator_cloneable, ec.check_estimator_repr, ec.check_no_attributes_set_in_init,
                  ec.check_parameters_default_constructible, ec.check_get_params_invariance, ec.check_set_params,
                  ec.check_do_not_raise_errors_in_init_or_set_params, ec.check_mixin_order, ec.check_valid_tag_types,
                  ec.check_estimator_tags_renamed, ec.check_estimators_unfitted):
        check(name, model)
    with pytest.warns(UserWarning, match="Can't test estimator .* three_d_array=True"):
        results = check_estimator(model, on_fail="raise")
    assert [r["check_name"] for r in results] == ["check_estimator_cloneable"]  # and no other


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    OneTokenAttentionRegressor(), OneTokenAttentionRegressor(program=8),
    OneTokenAttentionRegressor(program=12, gates=3),
    OneTokenAttentionClassifier(), OneTokenAttentionClassifier(program=8, loss="logistic"),
    # the checks' data have up to 10 features: d^3 = 1000 columns for "mhsa", which the torch backend solves
    # in a fraction of a second and the CVXPY solvers in minutes; about 15 s each (85 fits)
    pytest.param(OneTokenMHSARegressor(solver="fista", tol=1e-4), marks=pytest.mark.slow),
    OneTokenMixerRegressor(gates=2), OneTokenMixerClassifier(gates=2),
], ids=lambda m: f"{type(m).__name__}-{getattr(m, 'program', m._programs[0])}-{getattr(m, 'loss', 'squared')}")
def test_scikit_learn_check_estimator_on_one_token_sequences(model):
    expected = cannot_apply(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(model, expected_failed_checks={k: v[0] for k, v in expected.items()},
                                  on_fail=None, on_skip=None)
    failed = [(r["check_name"], repr(r["exception"])[:300]) for r in results if r["status"] == "failed"]
    assert not failed
    for r in results:
        if r["status"] == "skipped":  # the array-API check (it needs SCIPY_ARRAY_API=1), and the checks of an
            # optional package that is not installed (pandas, polars, pyarrow: scikit-learn skips them itself)
            assert r["check_name"] == "check_array_api_input" or OPTIONAL_SKIP.search(str(r["exception"])), r
        if r["check_name"] in expected:  # fails, and for the documented reason only
            assert r["status"] == "xfail", r["check_name"]
            messages = [str(e) for e in (r["exception"], r["exception"].__context__) if e is not None]
            assert any(re.search(expected[r["check_name"]][1], m) for m in messages), (r["check_name"], messages)
    assert sum(r["status"] == "passed" for r in results) >= 40 - sum(r["status"] == "skipped" for r in results)


# MHSAClassifier shares its fit, labels and predictions with AttentionClassifier (checked in full
# above) and its outputs with MHSARegressor; to keep the tests fast, these checks only:
MHSA_CLASSIFIER_CHECKS = ("check_classifiers_classes", "check_classifiers_one_label", "check_classifiers_train",
                          "check_classifier_data_not_an_array", "check_decision_proba_consistency",
                          "check_estimators_pickle", "check_fit_idempotent", "check_methods_sample_order_invariance",
                          "check_methods_subset_invariance", "check_estimators_nan_inf", "check_dict_unchanged",
                          "check_classifiers_regression_target", "check_supervised_y_no_nan", "check_estimators_dtypes")


def test_scikit_learn_checks_on_the_mhsa_classifier():
    from sklearn.utils import estimator_checks as ec

    model = OneTokenMHSAClassifier(solver="fista", tol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MHSA_CLASSIFIER_CHECKS:
            getattr(ec, name)(type(model).__name__, model)


def test_the_example_of_docs_estimators_runs(capsys):
    from conftest import run_doc_examples

    run_doc_examples("estimators.md")
    assert "True" in capsys.readouterr().out  # the chosen model is certified
