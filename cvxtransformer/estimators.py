"""scikit-learn estimators over the functional API (``make_problem``, ``solve``), as celer and skglm
offer for the lasso.

* :class:`AttentionRegressor`, :class:`AttentionClassifier`: the group-lasso attention programs
  (8), (10) and (12) (Ergen et al.);
* ``<prefix>Regressor``, ``<prefix>Classifier`` for every registered family that declares an estimator
  prefix (``Family.estimator``, :mod:`cvxtransformer.core.registry`), e.g. :class:`MHSARegressor` (the
  nuclear-norm program of linear multi-head self-attention), :class:`GatedMHSARegressor`,
  :class:`MixerRegressor`: built from the registry on first use (``dir()`` and ``__all__`` list them);
  their parameters are the gates' (``gates``, ``gate_seed``) for a family with gates, else none but
  those every estimator takes;
* :class:`ConvexRegressor`, :class:`ConvexClassifier`: any registered program family, named by
  ``program``; the classes above are these with the program fixed (or, for the attention programs,
  restricted to (8), (10), (12)) and their own defaults.

``X`` is 3-d, ``(N, n, d)``: N sequences of n tokens of dimension d (docs/conventions.md). The
losses are summed over samples, so ``beta`` grows with N; ``beta_frac`` (beta as a fraction of
the training data's beta_max) does not. ``__init__`` stores the parameters; ``fit`` validates
them, solves the program and certifies the solution: ``coef_`` is Z in the program's shape,
``certificate_`` the verifier's :class:`~cvxtransformer.core.certificate.Certificate`,
``dual_gap_`` its duality gap ``P(Z) - D(V)`` (absolute; ``certificate_.relative_gap`` is the
relative one, ``(P(Z) - D(V)) / D(V)``, a bound on ``(P(Z) - p*) / p*``). A fit whose certificate
does not reach ``tol`` warns (``ConvergenceWarning``).

Needs scikit-learn (``pip install 'cvxtransformer[sklearn]'``); ``import cvxtransformer`` does not.

Example
-------
>>> import numpy as np
>>> from cvxtransformer.estimators import AttentionRegressor
>>> X = np.random.default_rng(0).standard_normal((40, 4, 3))
>>> y = X[:, 1, :2] @ [1.0, -2.0]
>>> model = AttentionRegressor(program=8, beta_frac=0.05).fit(X[:30], y[:30])
>>> model.coef_.shape, model.certificate_.certified, bool(model.score(X[30:], y[30:]) > 0.9)
((4, 3), True, True)
"""
import textwrap
import warnings

import numpy as np

from .core.errors import MissingDependencyError, invalid

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, TransformerMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import r2_score
    from sklearn.preprocessing import StandardScaler
    from sklearn.utils.validation import check_is_fitted
except ImportError:
    raise MissingDependencyError("cvxtransformer.estimators needs scikit-learn; "
                                 "pip install 'cvxtransformer[sklearn]'") from None

from .core.losses import encode_classes
from .core.problem import make_problem, parse_program
from .core.validation import check_array, check_bool, check_choice, check_int, check_tol
from .solving import solve

# the public classes defined here; the families' classes are added on demand (module __getattr__, __dir__)
_DEFINED = ["AttentionClassifier", "AttentionRegressor", "ConvexClassifier", "ConvexRegressor", "TokenStandardScaler"]


class _ConvexEstimator(BaseEstimator):
    """Fit and predict shared by the estimators; subclasses set how targets are encoded."""

    _programs = None  # the values the ``program`` parameter may take (None: every registered family)

    def _program(self):
        if self._programs is not None and len(self._programs) == 1:
            return self._programs[0]
        program = parse_program(self.program)  # a registered family, or an error naming ``program``
        if self._programs is not None and program not in self._programs:
            *first, last = map(str, self._programs)
            _family_classes()  # build the families' classes, so that they are found below
            takers = [cls.__name__ for cls in _subclasses(_ConvexEstimator)  # this module's (not users' subclasses)
                      if cls.__module__ == __name__ and cls._programs is not None and program in cls._programs]
            raise invalid("program", f"{', '.join(first)} or {last}", repr(program),
                          f"use {' or '.join(takers or ['ConvexRegressor', 'ConvexClassifier'])} for {program!r}")
        return program

    def _solve(self, X, y, loss, n_classes=None):
        """Validate the parameters, build the problem on (X, y), solve and certify it, set the attributes."""
        program = self._program()
        tol = check_tol(self.tol)
        gates = check_int("gates", getattr(self, "gates", 8), 1)
        gate_seed = check_int("gate_seed", getattr(self, "gate_seed", 0))
        both_none = self.beta is None and self.beta_frac is None
        problem = make_problem(X, y, program=program, loss=loss, beta=self.beta,
                               beta_frac=0.1 if both_none else self.beta_frac, gates=gates, gate_seed=gate_seed,
                               n_classes=n_classes)
        beta, beta_max = problem.beta, float(problem.beta_max())
        result = solve(problem, solver=self.solver, tol=tol, refine=self.refine)
        cert = result.certificate
        self.problem_, self.coef_, self.certificate_ = problem, result.Z, cert
        self.beta_, self.beta_max_, self.dual_gap_ = beta, beta_max, cert.duality_gap
        self.n_iter_ = 0 if result.iterations is None else int(result.iterations)
        self.solver_, self.solver_status_ = result.solver, result.status
        if not cert.certified:
            warnings.warn(f"{type(self).__name__}: relative duality gap {cert.relative_gap:.2e} is above tol "
                          f"{tol:.1e} (solver status: {result.status}); the solution is not certified: {cert.note}",
                          ConvergenceWarning, stacklevel=3)
        return self

    def _outputs(self, X):
        """``yhat`` of shape (N, n_outputs) on new data ``X`` (N, n, d): ``program.on(X).forward(coef_)``."""
        check_is_fitted(self, "coef_")
        X = check_array("X", X, 3, "shape (N, n, d)")
        program = self.problem_.program
        n, d = program.X.shape[1:]
        if program.any_length:
            if X.shape[2] != d:
                raise invalid("X", f"tokens of dimension d = {d}, as in fit", f"shape {X.shape}")
        elif X.shape[1:] != (n, d):
            raise invalid("X", f"shape (N, {n}, {d}), as in fit", f"shape {X.shape}")
        return program.on(X).forward(self.coef_)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # X is (N, n, d); see docs/estimators.md for the checks
        tags.input_tags.three_d_array = True
        return tags


def _subclasses(cls):
    """Every subclass of ``cls``, depth first."""
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def _targets(y):
    if y is None:
        raise invalid("y", "targets, one per sample of X", "None", "pass y to fit")
    return np.asarray(y)


class _Regressor(RegressorMixin, _ConvexEstimator):
    def fit(self, X, y):
        """Fit on ``X`` (N, n, d) and real targets ``y``: (N,), (N, c), or (N, n, c) (one per token).

        Returns self."""
        y = _targets(y)
        if y.dtype.kind == "O":  # numbers held as Python objects
            try:
                y = y.astype(float)
            except (TypeError, ValueError):
                raise invalid("y", "real targets", "non-numeric values") from None
        self._solve(X, y, "squared")
        self._target_ndim, self._target_width = y.ndim, y.shape[-1]
        return self

    def predict(self, X):
        """Predictions on ``X`` (N, n, d), in the shape of the targets of ``fit``."""
        out = self._outputs(X)
        if self._target_ndim == 1:
            return out[:, 0]
        if self._target_ndim == 3:  # per token (N, n, c) or per channel (N, n_out, d): rows of the last width
            return out.reshape(out.shape[0], -1, self._target_width)
        return out

    def score(self, X, y, sample_weight=None):
        """R^2 of the predictions (averaged over outputs, as scikit-learn's ``r2_score``)."""
        y, pred = np.asarray(y, dtype=float), self.predict(X)
        if y.ndim == 3:
            y, pred = y.reshape(len(y), -1), pred.reshape(len(pred), -1)
        return r2_score(y, pred, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = str(getattr(self, "program", None)) != "8"  # (8): scalar output
        return tags


class _Classifier(ClassifierMixin, _ConvexEstimator):
    def fit(self, X, y):
        """Fit on ``X`` (N, n, d) and labels ``y`` (N,) of any kind (ints, strings, ...).

        The labels are mapped to the loss's encoding: ``classes_[0] -> -1``, ``classes_[1] -> +1``
        for the logistic loss (two classes), ``classes_[k] -> k`` for cross-entropy. Returns self."""
        loss = check_choice("loss", self.loss, ("logistic", "cross_entropy"))
        y = _targets(y)
        if y.ndim != 1:
            raise invalid("y", "labels of shape (N,)", f"shape {y.shape}", "pass one label per sample")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)):
                raise invalid("y", "finite labels", "NaN/Inf entries", "remove those samples")
            if np.any(y != np.round(y)):
                raise invalid("y", "class labels", "continuous values (non-integer floats)",
                              "use a regressor for real targets")
        codes, classes = encode_classes(y, loss)
        if len(classes) < 2:
            raise invalid("y", "at least 2 classes", "1 class", "a classifier needs two labels or more")
        self._solve(X, codes, loss, n_classes=len(classes) if loss == "cross_entropy" else None)
        self.classes_ = classes
        return self

    def decision_function(self, X):
        """Scores on ``X`` (N, n, d): (N,) for two classes (positive: ``classes_[1]``), else (N, c)."""
        out = self._outputs(X)
        if out.shape[1] == 1:
            return out[:, 0]
        return out[:, 1] - out[:, 0] if out.shape[1] == 2 else out

    def predict_proba(self, X):
        """Class probabilities (N, len(classes_)): the sigmoid (logistic) or softmax (cross-entropy)
        of the program's outputs."""
        out = self._outputs(X)
        if out.shape[1] == 1:
            p = 0.5 * (1.0 + np.tanh(0.5 * out[:, 0]))  # the sigmoid, without overflow
            return np.column_stack([1.0 - p, p])
        e = np.exp(out - out.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X):
        """Labels (from ``classes_``): the sign of the output (logistic; 0 counts as ``classes_[1]``,
        as the loss's accuracy counts it) or its argmax (cross-entropy)."""
        out = self._outputs(X)
        index = (out[:, 0] >= 0).astype(int) if out.shape[1] == 1 else np.argmax(out, axis=1)
        return self.classes_[index]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = self.loss != "logistic"
        return tags


_PARAMETERS = """\
    beta : float > 0 or None
        Regularization weight of the summed objective (docs/conventions.md).
    beta_frac : float > 0 or None
        beta = beta_frac * beta_max of the training data; used when ``beta`` is None (default 0.1
        when both are None). beta_frac >= 1 gives Z = 0.
    solver : {"auto", "clarabel", "scs", "fista"}
        "auto" (default): Clarabel for a small problem, the torch backend "fista" otherwise
        (:func:`cvxtransformer.choose_solver`); ``solver_`` names the one that ran
    tol : float in (0, 1), the relative duality gap to certify
    refine : True, False or "auto", the verifier's refined dual point (:func:`cvxtransformer.certify`)
"""
_GATES = """\
    gates : int >= 1, number of gates of a program with gates (h of (12); ignored by (8) and (10))
    gate_seed : int, seed of the gates (U1 (h, n), U2 (h, d) of program (12)), sampled in ``fit``
"""
_ATTRIBUTES = """
    Attributes
    ----------
    coef_ : ndarray, Z in the program's shape (``problem_.program.shape``): (n, d) for (8), (c, n, d)
        for (10), (h, c, n, d) for (12); each family's is in its program's documentation
    certificate_ : Certificate recomputed by the verifier (relative gap, KKT residuals, heads...)
    dual_gap_ : float, the duality gap P(Z) - D(V) of the certificate
    n_iter_ : int, the solver's iterations (0 when beta >= beta_max: Z = 0 without a solve)
    beta_, beta_max_ : float, the beta used and beta_max of the training data
    problem_ : the ConvexProblem solved (its program holds the gates);
        ``ct.recover_weights(problem_, coef_)`` gives the nonconvex network's weights
    solver_ : str, the solver that ran ("clarabel", "scs" or "fista": what ``solver="auto"`` chose)
    solver_status_ : str, the solver's own status (reported, never trusted)
"""


class ConvexRegressor(_Regressor):
    __doc__ = """Any registered program family (``program``) with the squared loss.

    Parameters
    ----------
    program : a registered program's name (8, 10, 12, a built-in family's name or one registered by
        :func:`cvxtransformer.core.registry.register`; ``ct.core.registry.families()`` lists them); targets as
        :func:`cvxtransformer.make_problem` takes
""" + _PARAMETERS + _GATES + _ATTRIBUTES

    def __init__(self, program=10, beta=None, beta_frac=None, gates=8, gate_seed=0, solver="auto", tol=1e-6,
                 refine="auto"):
        self.program, self.beta, self.beta_frac, self.gates, self.gate_seed = program, beta, beta_frac, gates, gate_seed
        self.solver, self.tol, self.refine = solver, tol, refine


class ConvexClassifier(_Classifier):
    __doc__ = """Any registered program family (``program``) with the logistic or cross-entropy loss.

    Parameters
    ----------
    program : a registered program's name, as for :class:`ConvexRegressor`
    loss : {"cross_entropy", "logistic"} (logistic: two classes)
""" + _PARAMETERS + _GATES + _ATTRIBUTES + """    classes_ : ndarray, the labels seen in ``fit``, sorted
"""

    def __init__(self, program=10, loss="cross_entropy", beta=None, beta_frac=None, gates=8, gate_seed=0,
                 solver="auto", tol=1e-6, refine="auto"):
        self.program, self.loss, self.beta, self.beta_frac = program, loss, beta, beta_frac
        self.gates, self.gate_seed, self.solver, self.tol, self.refine = gates, gate_seed, solver, tol, refine


class AttentionRegressor(ConvexRegressor):
    __doc__ = """Group-lasso attention program (8), (10) or (12) with the squared loss.

    Parameters
    ----------
    program : {8, 10, 12}
        8: scalar output (y of shape (N,)); 10: c outputs; 12: with a gated-ReLU FCN.
""" + _PARAMETERS + _GATES + _ATTRIBUTES
    _programs = (8, 10, 12)


class AttentionClassifier(ConvexClassifier):
    __doc__ = """Group-lasso attention program (8), (10) or (12) with the logistic or cross-entropy loss.

    Parameters
    ----------
    program : {8, 10, 12} (program (8) takes the logistic loss only)
    loss : {"cross_entropy", "logistic"} (logistic: two classes)
""" + _PARAMETERS + _GATES + _ATTRIBUTES + """    classes_ : ndarray, the labels seen in ``fit``, sorted
"""
    _programs = (8, 10, 12)


class _PlainRegressor(ConvexRegressor):
    """A regressor of one family without gates (``_programs``): no ``program`` or gate parameters."""

    def __init__(self, beta=None, beta_frac=None, solver="auto", tol=1e-6, refine="auto"):
        self.beta, self.beta_frac, self.solver, self.tol, self.refine = beta, beta_frac, solver, tol, refine


class _PlainClassifier(ConvexClassifier):
    """A classifier of one family without gates (``_programs``): no ``program`` or gate parameters."""

    def __init__(self, loss="cross_entropy", beta=None, beta_frac=None, solver="auto", tol=1e-6, refine="auto"):
        self.loss, self.beta, self.beta_frac, self.solver, self.tol, self.refine = \
            loss, beta, beta_frac, solver, tol, refine


class _GatedRegressor(ConvexRegressor):
    """A regressor of one gated family (``_programs``): its parameters are the gates', not ``program``."""

    def __init__(self, gates=8, gate_seed=0, beta=None, beta_frac=None, solver="auto", tol=1e-6, refine="auto"):
        self.gates, self.gate_seed, self.beta, self.beta_frac = gates, gate_seed, beta, beta_frac
        self.solver, self.tol, self.refine = solver, tol, refine


class _GatedClassifier(ConvexClassifier):
    """A classifier of one gated family (``_programs``): its parameters are the gates', not ``program``."""

    def __init__(self, loss="cross_entropy", gates=8, gate_seed=0, beta=None, beta_frac=None, solver="auto",
                 tol=1e-6, refine="auto"):
        self.loss, self.gates, self.gate_seed, self.beta, self.beta_frac = loss, gates, gate_seed, beta, beta_frac
        self.solver, self.tol, self.refine = solver, tol, refine


_BASES = {("Regressor", False): _PlainRegressor, ("Classifier", False): _PlainClassifier,
          ("Regressor", True): _GatedRegressor, ("Classifier", True): _GatedClassifier}


def _family_estimators():
    """Class name -> (family, "Regressor" or "Classifier") for every registered family that declares an
    estimator prefix (``Family.estimator``)."""
    from .core.registry import families

    return {f"{fam.estimator[0]}{role}": (fam, role) for fam in families().values() if fam.estimator
            for role in ("Regressor", "Classifier")}


def _family_class(name, fam, role):
    """The estimator class ``name`` of a family, built once and kept in this module (so that pickle and
    scikit-learn's ``clone`` find it by its ``__module__`` and ``__qualname__``)."""
    if name in globals():
        return globals()[name]
    prefix, title, targets = fam.estimator
    gated = "gates" in fam.options
    program = f'``"{fam.name}"``' if isinstance(fam.name, str) else f"({fam.name})"
    if role == "Regressor":
        head = textwrap.fill(f"{title} ({program}), squared loss.", 108, subsequent_indent="    ")
        if targets:
            head += "\n\n" + textwrap.fill(targets, 108, initial_indent="    ", subsequent_indent="    ")
        params = ""
    else:
        head = textwrap.fill(f"{title} ({program}), logistic or cross-entropy loss on the pooled output.", 108,
                             subsequent_indent="    ")
        params = '    loss : {"cross_entropy", "logistic"} (logistic: two classes)\n'
    if gated:
        arrays = " and ".join(f"{fam.program.gate_array_kinds[k]} {k}" for k in fam.gate_arrays) or "gates"
        params += (f"    gates : int >= 1, number P of {arrays}, sampled in ``fit``\n"
                   f"    gate_seed : int, seed of the {arrays}\n")
    doc = f"{head}\n\n    Parameters\n    ----------\n" + params + _PARAMETERS + _ATTRIBUTES
    if role == "Classifier":
        doc += "    classes_ : ndarray, the labels seen in ``fit``, sorted\n"
    cls = type(name, (_BASES[role, gated],), {"__doc__": doc, "__module__": __name__, "__qualname__": name,
                                              "_programs": (fam.name,)})
    globals()[name] = cls
    return cls


def _family_classes():
    """Every registered family's estimator classes, built (name -> class)."""
    return {name: _family_class(name, *found) for name, found in _family_estimators().items()}


def __getattr__(name):
    if name == "__all__":
        return sorted(_DEFINED + list(_family_estimators()))
    found = None if name.startswith("_") else _family_estimators().get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _family_class(name, *found)


def __dir__():
    return sorted(set(globals()) | set(_family_estimators()))


class TokenStandardScaler(TransformerMixin, BaseEstimator):
    """scikit-learn's ``StandardScaler`` for 3-d X (N, n, d), which ``StandardScaler`` refuses: each of
    the d features is centred and scaled over every sample and token (the (N n, d) view of X), so
    that a ``Pipeline`` can standardise X before an estimator of this module. New X may have another
    number of tokens n.

    Parameters
    ----------
    with_mean, with_std : bool, as for ``StandardScaler``

    Attributes
    ----------
    scaler_ : the fitted ``StandardScaler`` of the (N n, d) view (``mean_``, ``scale_``)

    Example
    -------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> X = 5.0 + 3.0 * np.random.default_rng(0).standard_normal((40, 4, 3))
    >>> Z = TokenStandardScaler().fit_transform(X)
    >>> bool(np.allclose(Z.reshape(-1, 3).mean(axis=0), 0) and np.allclose(Z.reshape(-1, 3).std(axis=0), 1))
    True
    >>> model = make_pipeline(TokenStandardScaler(), AttentionRegressor(program=8, beta_frac=0.05)).fit(X, X[:, 1, 0])
    """

    def __init__(self, with_mean=True, with_std=True):
        self.with_mean, self.with_std = with_mean, with_std

    def fit(self, X, y=None):
        """Learn each feature's mean and standard deviation over the samples and tokens of ``X`` (N, n, d)."""
        X = check_array("X", X, 3, "shape (N, n, d)")
        with_mean, with_std = check_bool("with_mean", self.with_mean), check_bool("with_std", self.with_std)
        self.scaler_ = StandardScaler(with_mean=with_mean, with_std=with_std).fit(X.reshape(-1, X.shape[2]))
        return self

    def transform(self, X):
        """``X`` (N, n, d) with every feature standardised; the same shape."""
        check_is_fitted(self, "scaler_")
        X = check_array("X", X, 3, "shape (N, n, d)")
        d = self.scaler_.n_features_in_
        if X.shape[2] != d:
            raise invalid("X", f"tokens of dimension d = {d}, as in fit", f"shape {X.shape}")
        return self.scaler_.transform(X.reshape(-1, d)).reshape(X.shape)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.three_d_array = True
        return tags
