"""A convex training problem: a program, a loss, targets and a regulariser (docs/conventions.md).

    P(Z) = sum_i L(yhat_i(Z), y_i) + R(Z)
    D(V) = sum_i -L*(-V_i)   subject to dual_norm(A^T V) <= beta

with ``R`` the group lasso (programs (8), (10), (12)) or the nuclear norm (program (6) of
Sahiner et al.; summed over gates for the gated families), or any registered family's regulariser
(:mod:`.registry`). :func:`make_problem` validates
raw user input and is the one way in; the programs it builds are looked up by name in
:mod:`.registry`.
"""
import numpy as np

from .data import file_backed
from .errors import invalid
from .fingerprint import fingerprint
from .losses import are_class_labels, encode_classes, get_loss
from .registry import families, family
from .registry import gate_arrays as all_gate_arrays
from .validation import check_array, check_beta, check_gates_memory, check_int, check_positive, check_scale


class ConvexProblem:
    """A program with a loss, encoded targets and a regulariser; build with :func:`make_problem`.

    Attributes
    ----------
    program : the linear map Z -> yhat and its adjoint (:class:`~cvxtransformer.core.attention.AttentionProgram`,
        or the :class:`~cvxtransformer.core.programs.Program` of another registered family: :mod:`.registry`)
    loss : :class:`~cvxtransformer.core.losses.Loss`
    T : ndarray of shape (N, n_outputs), the encoded targets
    regularizer : :class:`~cvxtransformer.core.regularizers.GroupLasso` or ``NuclearNorm``, with beta
    classes : ndarray or None, the sorted class labels that :func:`make_problem` mapped (``classes[k] -> k``
        for cross-entropy, ``classes[0] -> -1``, ``classes[1] -> +1`` for logistic); None for numeric targets
    """

    def __init__(self, program, loss, T, regularizer, classes=None):
        self.program, self.loss, self.T, self.regularizer, self.classes = program, loss, T, regularizer, classes
        self._beta_max = self._scores0 = self._value0 = None
        self._mapped = {}  # name -> (array, its fingerprint) of memory-mapped data (checked by check_data)

    def check_data(self):
        """Check that memory-mapped data (X, or targets y) still hold the bytes they held when the problem
        was built (a file may be rewritten by another process); in-memory data is the problem's own
        read-only copy."""
        for name, (a, value) in self._mapped.items():
            if (a is self.program.X or a is self.T) and fingerprint(a) != value:
                raise invalid(name, "the memory-mapped data the problem was built on",
                              "a file whose content changed since (its fingerprint differs)",
                              "rebuild the problem with make_problem on the data as it is now")
        return self

    @property
    def beta(self):
        return self.regularizer.beta

    @property
    def reduction(self):
        """The reduction that pairs this program with its nonconvex network (Proposition 1, or
        Sahiner et al.'s theorems for linear and gated MHSA): ``invert`` recovers the network's weights."""
        return family(self.program.name).reduction

    def __repr__(self):
        p = self.program
        return (f"ConvexProblem({p.label}, loss={self.loss.name!r}, beta={self.beta:g}, "
                f"N={p.N}, shape={p.shape}, outputs={p.n_outputs})")

    def primal_objective(self, Z):
        """P(Z) for coefficients of the program's shape."""
        return self.loss.value(self.program.forward(Z), self.T) + self.regularizer.value(Z)

    def dual_objective(self, V):
        """D(V) for V of shape (N, n_outputs), which must be dual feasible."""
        return self.loss.dual_objective(V, self.T)

    def residual_dual(self, Z):
        """``-grad L(yhat(Z))`` of shape (N, n_outputs), the unscaled dual point of Z."""
        return self.loss.dual_variable(self.program.forward(Z), self.T)

    def beta_max(self):
        """Smallest beta for which Z = 0 is optimal: ``dual_norm(A^T (-grad L(0)))`` (computed once, with the scores
        at zero and P(0), :meth:`loss_at_zero`: the three values at Z = 0 that a solve from 0 starts with)."""
        if self._beta_max is None:
            zero = np.zeros_like(self.T)
            self._scores0 = self.program.adjoint(self.loss.dual_variable(zero, self.T))
            self._scores0.flags.writeable = False
            self._beta_max = self.regularizer.dual_norm(self._scores0)
            self.loss_at_zero()
        return self._beta_max

    def loss_at_zero(self):
        """``P(0) = L(0)``, the loss at Z = 0 (float; computed once, shared with :meth:`with_beta`'s problems)."""
        if self._value0 is None:
            self._value0 = float(self.loss.value(np.zeros_like(self.T), self.T))
        return self._value0

    def scores_at_zero(self):
        """``A^T (-grad L(0))`` in the program's shape, as :meth:`beta_max` computed it (read-only; None
        before that: computing it is a pass over the data). The torch backend's first check at Z = 0 reads it."""
        return self._scores0

    def with_beta(self, beta):
        """The same data, program and loss with another beta (shares the program)."""
        other = ConvexProblem(self.program, self.loss, self.T, self.regularizer.with_beta(check_beta(beta)),
                              self.classes)
        other._beta_max, other._scores0, other._value0 = self._beta_max, self._scores0, self._value0
        other._mapped = self._mapped
        return other

    def with_beta_frac(self, beta_frac):
        """The same problem with ``beta = beta_frac * beta_max()`` (``beta_frac`` itself when beta_max is 0:
        then Z = 0 is optimal for every beta > 0). ``beta_frac >= 1`` gives Z = 0. The one place
        ``make_problem``, the command line's ``--beta-frac`` and the estimators' ``beta_frac`` compute beta."""
        beta_frac = check_positive("beta_frac", beta_frac)
        beta_max = float(self.beta_max())
        return self.with_beta(beta_frac * beta_max if beta_max > 0 else beta_frac)

    def zeros(self):
        """Z = 0 in the program's shape."""
        return np.zeros(self.program.shape)


def parse_program(program):
    """A program's name (8, 10, 12 or a registered family's name) from an int or a string ("8" or the
    name); errors name the argument."""
    return family(program).name


def make_problem(X, y, program=10, loss="squared", beta=None, beta_frac=None, gates=None, gate_seed=0,
                 n_classes=None, **gate_arrays):
    """Validate the data and build program (8), (10), (12) or the program of any registered family
    (:mod:`.registry`: the built-in ones are listed in ``MODULES``, each documented in its module).

    Parameters
    ----------
    X : array of shape (N, n, d)
    y : targets as docs/conventions.md fixes them: ``(N,)`` for (8); ``(N, c)`` or ``(N, n, c)`` with the
        squared loss; ``(N,)`` labels in {-1, +1} (logistic) or in [0, c) (cross-entropy). A family may
        read them otherwise (its program's ``check_target_shape``; e.g. for the multi-head
        self-attention programs, ``(N, n, c)`` targets are per token, all others are per sequence
        through the mean-pooled output). Labels that are not numbers (strings, booleans, ...) are class
        labels: sorted, ``classes[k] -> k`` (cross-entropy), ``classes[0] -> -1``, ``classes[1] -> +1``
        (logistic), kept as ``problem.classes`` (as the command line and the estimators map them)
    program : 8, 10, 12 or the name of a registered family (:mod:`.registry`)
    loss : {"squared", "logistic", "cross_entropy"} or a Loss
    beta : float > 0, the regularization weight; or
    beta_frac : float > 0, beta = beta_frac * beta_max of the data (``0 < beta_frac < 1`` gives a nonzero
        solution; losses are summed over samples, so beta grows with N and beta_frac does not).
        Exactly one of ``beta`` and ``beta_frac``
    n_classes : number of classes c for the cross-entropy loss (default ``max(y) + 1``)
    gates, gate_seed : how many gates to sample (default 8), and numpy's seed, for a family with gates
        whose gate arrays are not given
    **gate_arrays : the gate arrays of the program's family, by name (its program class's
        ``gate_array_kinds``, e.g. ``U1``, ``U2``, gate vectors (h, n) and (h, d) of program (12); the
        others are listed by :func:`.registry.gate_arrays`); sampled from ``gates`` and ``gate_seed`` when
        not given

    Notes
    -----
    The problem owns its data: in-memory arrays (X, y, the gates) are copied unless converted anyway,
    and kept read-only, so changing the caller's arrays afterwards changes nothing. A memory-mapped X
    (data larger than memory) is not copied: it is kept as a read-only view and its fingerprint
    (:mod:`.fingerprint`) is checked when the problem is certified (:meth:`ConvexProblem.check_data`).

    Example
    -------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).standard_normal((20, 4, 3))
    >>> P = make_problem(X, X[:, 0, 0], program=8, loss="squared", beta=0.5)
    >>> P.program.shape
    (4, 3)
    >>> Q = make_problem(X, X[:, 0, 0], program=8, beta_frac=0.1)
    >>> bool(Q.beta == 0.1 * Q.beta_max())
    True
    >>> make_problem(X, np.where(X[:, 0, 0] > 0, "dog", "cat"), program=8, loss="logistic", beta=0.5).classes
    array(['cat', 'dog'], dtype='<U3')
    >>> make_problem(X, X[:, 0, :2], program=12, beta=0.5, gates=2).program.shape
    (2, 2, 4, 3)
    """
    fam = family(program)
    program = fam.name
    loss = get_loss(loss)
    if loss.name not in fam.losses:
        raise invalid("loss", f"one of {fam.losses} for {fam.label}", repr(loss.name),
                      fam.program.loss_hint(program, loss.name))
    if (beta is None) == (beta_frac is None):
        raise invalid("beta, beta_frac", "exactly one of them", "neither" if beta is None else "both",
                      "pass beta (the regularization weight) or beta_frac (beta = beta_frac * beta_max of the data)")
    regularizer_beta = check_beta(beta) if beta_frac is None else check_positive("beta_frac", beta_frac)
    X = _owned(check_array("X", X, 3, "shape (N, n, d)"), X)
    classes = None
    if are_class_labels(y):
        y, classes = encode_classes(y, loss)
    N, n = X.shape[:2]
    y_arr = _owned(check_array("y", y, what="targets", nonempty=False), y)
    if y_arr.ndim == 0 or y_arr.shape[0] != N:
        raise invalid("y", f"{N} targets (one per sample of X)", f"shape {y_arr.shape}")
    if y_arr.size == 0:
        raise invalid("y", "at least one output per sample", f"shape {y_arr.shape} (no outputs)",
                      "give y one column per output, e.g. shape (N,) or (N, c)")
    fam.program.check_target_shape(X, y_arr)
    fam.program.check_targets(program, y_arr)
    T = loss.encode(y_arr, n_classes)  # new, or a view of y_arr
    T.flags.writeable = False
    gate_seed = check_int("gate_seed", gate_seed, 0)  # numpy's seeds: non-negative integers
    known = all_gate_arrays()
    unknown = [k for k in gate_arrays if k not in known]
    if unknown:
        raise invalid(", ".join(unknown), "the gate arrays of a program family (" + ", ".join(known) + ")",
                      "an unknown argument of make_problem", "check its spelling")
    gate_arrays = {k: a for k, a in gate_arrays.items() if a is not None}
    refused = [k for k in gate_arrays if k not in fam.gate_arrays]
    if refused:
        owner = next(f.name for f in families().values() if refused[0] in f.gate_arrays)
        raise invalid(", ".join(refused), f"no {known[refused[0]]} for program ({program})",
                      known[refused[0]], f"leave them out, or use program {owner!r}")
    options = {"gates": gates, "gate_seed": gate_seed,  # copies of the caller's arrays
               **{k: np.array(a) if isinstance(a, np.ndarray) else a for k, a in gate_arrays.items()}}
    _check_gates_memory(fam, X, y_arr, T, options)
    prog = fam.program.build(program, X, y_arr, T, **{k: options[k] for k in fam.options if k in options})
    for gate in prog.gate_arrays().values():
        gate.flags.writeable = False
    problem = ConvexProblem(prog, loss, T, prog.regularizer_class(regularizer_beta), classes)
    problem._mapped = {name: (a, fingerprint(a)) for name, a in (("X", prog.X), ("y", T)) if file_backed(a)}
    problem = check_scale(problem)
    return problem if beta_frac is None else problem.with_beta_frac(beta_frac)


def _check_gates_memory(fam, X, y, T, options):
    """Refuse, before any gate is sampled or used, gates whose masks, designs and solver's temporaries
    would not fit in memory (:meth:`~.programs.Program.gate_bytes` of the family's program): the gate
    arrays given (their rows), or ``gates`` to be sampled (default 8, as the families sample)."""
    per_gate = fam.gate_arrays and fam.program.gate_bytes(X, y, T)
    if not per_gate:
        return
    given = next((k for k in fam.gate_arrays if k in options), None)
    if given is not None:
        if np.ndim(options[given]) >= 1:  # (shapes are checked by the program's build)
            check_gates_memory(np.shape(options[given])[0], per_gate, given, fam.program.gate_array_kinds[given])
        return
    check_gates_memory(check_int("gates", 8 if options["gates"] is None else options["gates"], 1), per_gate)


def _owned(a, given):
    """``a`` (validated from the caller's ``given``) as the problem's own read-only array: a copy when it
    may share memory with the caller's, a read-only view of a memory map (never copied: it may be
    larger than memory; its fingerprint is checked instead)."""
    if file_backed(a):
        if a.flags.writeable:  # a map opened for writing ("r+"): a read-only view of it
            a = a.view()
    elif a is given or not a.flags.owndata:
        a = a.copy()
    a.flags.writeable = False
    return a


def check_problem(problem, name="problem"):
    """A :class:`ConvexProblem` (from ``make_problem``); anything else is refused by name before it is used."""
    if not isinstance(problem, ConvexProblem):
        raise invalid(name, "a ConvexProblem from make_problem", type(problem).__name__,
                      "build it with cvxtransformer.make_problem(X, y, ...)")
    return problem
