""":func:`compare`: the certified convex optimum against networks trained by SGD or Adam.

:func:`plan` validates everything (no solve, no training); :meth:`Plan.run` solves every convex
program a model needs (with the verifier's refined dual point, so that no gap is inflated by a
loose bound), trains the models and returns a :class:`~.result.Comparison`. :func:`compare` is
both in one call. With ``tune`` the learning rate and beta of every model are chosen on the
validation split first (:mod:`.tuning`).
"""
import copy
import time
from dataclasses import dataclass

import numpy as np

from ..core.errors import InvalidInputError, invalid
from .models import MODELS, check_heads, check_models

LR_GRID, BETA_GRID = (1e-3, 1e-2, 1e-1), (1e-3, 1e-2, 1e-1)
DEFAULT_LR = 1e-2


@dataclass
class Plan:
    """A validated comparison, not yet run (see :func:`compare` for the fields)."""

    problem: object
    models: list
    heads: list
    options: dict
    seed: int
    solver: str
    tol: float
    gates: object
    gate_seed: int
    test: tuple
    validation: tuple
    tune: dict
    teacher: np.ndarray
    sequence: bool
    progress: bool
    networks: dict = None  # name -> a torch module of the user's (compare's ``networks``)

    @property
    def heartbeat(self):
        """Seconds of a silent exact solve before a progress line (None without ``progress``)."""
        return 5.0 if self.progress else None

    def bounding(self, model, problem=None):
        """The problem whose certificate bounds ``model`` (None for (3); for a network of the user's, None
        until it is trained: :meth:`bound_of`), at ``problem``'s beta."""
        row = None if model in self.networks else MODELS[model].bounding
        return None if row is None else row(problem or self.problem, self.gates, self.gate_seed)

    def problems(self, problem=None):
        """program -> problem: the comparison's program and every bounding program, at ``problem``'s beta."""
        problem = problem or self.problem
        out = {problem.program.name: problem}
        for model in self.models:
            bound = self.bounding(model, problem)
            if bound is not None:
                out.setdefault(bound.program.name, bound)
        return out

    def train(self, model, problem, lr, heads, evaluation):
        """Build ``model`` on ``problem`` (its bounding problem, or the comparison's) and train it at
        ``problem.beta`` and ``lr`` (a network of the user's: a copy of it, from its own weights);
        ``evaluation``: the split whose loss is recorded, (X, T) or None."""
        from ..nn.trainer import train

        if model in self.networks:
            net = copy.deepcopy(self.networks[model])
        else:
            net = MODELS[model].build(problem, heads, self.sequence, self.seed)
        X_eval, T_eval = (None, None) if evaluation is None else evaluation
        return train(net, problem.program.X, problem.T, problem.loss, problem.beta, seed=self.seed,
                     progress=self.progress, X_test=X_eval, T_test=T_eval, **dict(self.options, lr=lr))

    def bound_of(self, model, run, problem, bound):
        """The bounding problem of a trained run: ``bound`` for compare's models; for a network of the
        user's, ``problem`` where its certificate covers it, else None. It covers a network that offers
        ``to_weights()`` giving the family's heads (which ``certify_network`` takes), at which the family's
        objective is the network's own (to 1e-9): then D(V) bounds it, as any network of the family."""
        if model not in self.networks:
            return bound
        from ..core.reductions import nonconvex_objective

        net = run.network
        try:
            family = nonconvex_objective(problem, net.to_weights())
        except (AttributeError, TypeError, ValueError, InvalidInputError):  # no to_weights, or not the family's heads
            return None
        own = run.objective
        return problem if own is not None and abs(family - own) <= 1e-9 * max(1.0, abs(family)) else None

    def run(self):
        """Solve, train and report: a :class:`~.result.Comparison`."""
        start = time.perf_counter()
        if self.tune is not None:
            from .tuning import run_tuned

            out = run_tuned(self)
        else:
            out = self._run_fixed()
        out.seconds = time.perf_counter() - start
        return out

    def _run_fixed(self):
        from ..solving import solve
        from .result import Comparison, ModelResult, convex_summary, head_counts, label, model_report

        problems = self.problems()
        solutions = {p: solve(P, solver=self.solver, tol=self.tol, refine=True, heartbeat_after=self.heartbeat)
                     for p, P in problems.items()}
        convex = {p: convex_summary(solutions[p], P, self.test) for p, P in problems.items()}
        main = self.problem.program.name
        runs = {}
        for model in self.models:
            bound = self.bounding(model)
            problem = problems[main if bound is None else bound.program.name]
            counts = head_counts(self, model, problem, solutions[problem.program.name])
            for m in counts:
                name = model if len(counts) == 1 else f"{model}_m{m}"
                run = self.train(model, problem, self.options["lr"], m, self.test)
                report = model_report(model, self.bound_of(model, run, problem, bound), run, problem,
                                      convex[problem.program.name], main)
                runs[name] = ModelResult(name, model, label(model, main, m), run, report)
        return Comparison(self, problems, solutions, convex, runs)


def check_split(problem, split, names):
    """``(X, T)`` of another split ``(X, y)`` (test, validation), checked against the problem's data
    and encoded by its loss; ``names``: the two arrays' names in messages, e.g. ``("X_test", "y_test")``."""
    from ..core.validation import check_array

    if split is None:
        return None
    if not isinstance(split, (tuple, list)) or len(split) != 2:
        raise invalid(f"{names[0]}, {names[1]}", "a pair (X, y)", type(split).__name__)
    shape = problem.program.X.shape
    X = check_array(names[0], split[0], 3, f"shape (N', {shape[1]}, {shape[2]}) like X")
    if X.shape[1:] != shape[1:]:
        raise invalid(names[0], "the token shape of X", f"shape {X.shape}")
    y = np.asarray(split[1])
    if y.ndim == 0 or y.shape[0] != X.shape[0]:
        raise invalid(names[1], f"{X.shape[0]} targets (one per sample of {names[0]})", f"shape {y.shape}")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise invalid(names[1], "finite values", "NaN/Inf entries")
    n_classes = problem.T.shape[1] if problem.loss.name == "cross_entropy" else None
    T = problem.loss.encode(y, n_classes)
    if T.shape[1] != problem.T.shape[1]:
        raise invalid(names[1], "targets shaped like the training targets", f"shape {y.shape}")
    return X, T


def _check_teacher(A, problem):
    from ..core.validation import check_array

    if A is None:
        return None
    n = problem.program.X.shape[1]
    A = check_array("teacher_attention", A, 2, f"shape ({n}, {n})")
    if A.shape != (n, n):
        raise invalid("teacher_attention", f"shape ({n}, {n}) (output token, input token)", f"shape {A.shape}")
    return A


def _check_grid(name, values):
    from ..core.validation import check_positive

    values = [check_positive(name, v) for v in values]
    if not values:
        raise invalid(name, "a non-empty list of numbers > 0", "an empty list")
    return list(dict.fromkeys(values))


def _check_networks(networks, problem, models):
    """The user's networks (name -> torch module), checked: a dict of modules with the faces of
    :class:`cvxtransformer.nn.networks.Network` that the trainer and the report call, named apart from
    compare's models, whose outputs on a sample have the targets' shape."""
    import torch

    if networks is None:
        return {}
    if not isinstance(networks, dict):
        raise invalid("networks", "a dict name -> torch module (cvxtransformer.nn.networks.Network's interface)",
                      type(networks).__name__)
    faces = ("encode_inputs", "forward", "penalty", "objective", "arrays")
    for name, net in networks.items():
        what = f"networks[{name!r}]"
        if not isinstance(name, str) or name in MODELS or name in models:
            raise invalid("networks", "names apart from compare's models", repr(name))
        lacks = [f for f in faces if not callable(getattr(net, f, None))]
        if not isinstance(net, torch.nn.Module) or lacks:
            raise invalid(what, "a torch module with " + ", ".join(faces) + " (cvxtransformer.nn.networks.Network)",
                          type(net).__name__ + (f" without {', '.join(lacks)}" if lacks else ""))
        with torch.no_grad():
            out = net(*net.encode_inputs(problem.program.X[:1]))
        if tuple(out.shape) != (1, problem.T.shape[1]):
            raise invalid(what, f"outputs of shape (N, {problem.T.shape[1]}) (the encoded targets')",
                          f"shape {tuple(out.shape)} on one sample")
    return dict(networks)


def plan(problem, models=None, optimizer="adam", lr=None, steps=2000, heads=None, seed=0, batch_size=None,
         eval_every=None, solver="auto", tol=1e-6, gates=8, gate_seed=0, test=None, validation=None, tune=None,
         teacher_attention=None, sequence=None, progress=False, networks=None):
    """Validate the arguments of :func:`compare` (no solve, no training): a :class:`Plan`."""
    from ..core.problem import check_problem
    from ..core.validation import check_bool, check_choice, check_int, check_seed, check_tol
    from ..nn.trainer import check_training_options
    from cvxtransformer.solvers import SOLVERS

    check_problem(problem)
    program = problem.program.name
    if tune is True:
        tune = {}
    if tune is not None:
        if not isinstance(tune, dict) or set(tune) - {"lr", "beta_frac"}:
            raise invalid("tune", "None, True or a dict with keys lr and beta_frac (the grids)", repr(tune))
        if lr is not None:
            raise InvalidInputError("lr: not with tune, which chooses it on the validation split; give the values "
                                    "to try in tune['lr']")
        if validation is None:
            raise InvalidInputError("validation: tune needs a validation split (X_val, y_val)")
        tune = {"lr": _check_grid("tune['lr']", tune.get("lr", LR_GRID)),
                "beta_frac": _check_grid("tune['beta_frac']", tune.get("beta_frac", BETA_GRID))}
    models = check_models(models, program, tuned=tune is not None, outputs=problem.program.n_outputs)
    networks = _check_networks(networks, problem, models)
    if not models and not networks:
        raise invalid("models", f"a model of compare for {problem.program.label}", "none: its family declares none",
                      "pass networks of your own, ct.compare(problem, networks={'name': torch module}), or solve it "
                      "alone (ct.solve; cvxtransformer solve)")
    models += list(networks)
    heads = check_heads(heads)
    if tune is not None and heads is not None and len(heads) > 1:
        raise invalid("heads", "one head count with tune", repr(heads))
    N = problem.program.X.shape[0]
    options = dict(zip(("optimizer", "lr", "steps", "batch_size", "eval_every"), check_training_options(
        optimizer, DEFAULT_LR if lr is None else lr, steps, batch_size, eval_every, None, N)[:5]))
    check_choice("solver", solver, ("auto", *SOLVERS))
    progress = check_bool("progress", progress)
    given = sequence is not None  # the default follows the program (per-token or per-channel outputs)
    if given:
        sequence = check_bool("sequence", sequence)
    if sequence is None:
        sequence = not problem.program.pooled if hasattr(problem.program, "pooled") else False
    n = problem.program.X.shape[1]
    if given and sequence and problem.T.shape[1] % n:
        raise invalid("sequence", f"False: {problem.T.shape[1]} outputs are not a multiple of n = {n} tokens", "True")
    out = Plan(problem=problem, models=models, heads=heads, options=options, seed=check_seed("seed", seed),
               solver=solver, tol=check_tol(tol), gates=gates, gate_seed=check_seed("gate_seed", gate_seed),
               test=check_split(problem, test, ("X_test", "y_test")),
               validation=check_split(problem, validation, ("X_val", "y_val")), tune=tune,
               teacher=_check_teacher(teacher_attention, problem), sequence=bool(sequence), progress=progress,
               networks=networks)
    out.problems()  # builds (and checks) every bounding problem now, e.g. the gates
    return out


def compare(problem, models=None, optimizer="adam", lr=None, steps=2000, heads=None, seed=0, batch_size=None,
            eval_every=None, solver="auto", tol=1e-6, gates=8, gate_seed=0, test=None, validation=None,
            tune=None, teacher_attention=None, sequence=None, progress=False, networks=None):
    """Solve the convex program exactly, train nonconvex networks by SGD or Adam on the same data and
    beta, and certify how far each network is from the optimum of its family.

    For each network the convex program bounds (networks (9), (11), (5): :data:`.models.MODELS`), the
    certified gap is ``objective - D(V)``, with ``D(V)`` the dual value of the certificate of its
    bounding program: a lower bound on the objective ``sum_i L(yhat_i, y_i) + penalty`` of every
    network of that family, whatever its number of heads. Softmax attention (3) is not covered: its
    objective is compared with the convex optimum, and its gap is None.

    Parameters
    ----------
    problem : ConvexProblem of program (8), (10), (12) or any registered family's program
        (:func:`cvxtransformer.make_problem`), at the beta every model shares (with ``tune``: only its
        data are used)
    models : list or comma-separated string from ``alternative`` (9), ``gated`` (11), ``softmax`` (3),
        ``convex`` (Z of the program itself, trained by the same optimiser) and the models that the
        other families' reductions declare (``Reduction.models``, collected in
        :data:`cvxtransformer.comparison.models.MODELS`: each bounded by its family's program on its
        gates, or, marked ``bounded=False``, not bounded); default ``alternative, softmax``
        (``gated, softmax`` for (12); for another family, its models marked ``default``)
    optimizer, lr, steps, batch_size, eval_every : the training of every network
        (:func:`cvxtransformer.nn.trainer.train`; ``lr`` default 0.01)
    heads : head count(s) of the networks, an int or a list (one run per count); default: one head
        per group of the bounding program for (9)/(11), enough for any convex solution; for (5) and
        the MHSA networks, rank(Z*) - 1, rank(Z*) and 2 rank(Z*) (rank summed over the gates)
    seed : seed of the initialisations and mini-batches
    solver, tol : the exact solves ("auto", "clarabel", "scs" or "fista") and the relative gap they certify
    gates, gate_seed : the gates of program (12) and network (11) when ``problem`` has none: a count
        h (sampled from ``gate_seed``) or ``(U1, U2)``
    test : optional ``(X_test, y_test)``, raw targets as for ``make_problem``: test loss and accuracy
    validation : ``(X_val, y_val)``, needed by ``tune``
    tune : None, True or ``{"lr": [...], "beta_frac": [...]}``: for each model, every (learning rate,
        beta = fraction * beta_max) of the grid (default 1e-3, 1e-2, 1e-1 for both) is trained and
        scored by its validation loss; the best is retrained and reported; the exact solutions are
        tuned over the same betas. The test split is not used before every choice is made.
    teacher_attention : optional (n, n) map (output token, input token) of a teacher, for the plots
        and ``attention_distance_to_teacher``
    sequence : targets per token (y of shape (N, n, c)); default: True when the program's outputs are
        per token (a program with ``pooled`` False), else False
    progress : progress bars (and, with ``tune``, one line per grid point on stderr)
    networks : networks of your own, ``{"name": module}``: torch modules with the interface of
        :class:`cvxtransformer.nn.networks.Network` (``encode_inputs``, ``forward``, ``penalty``,
        ``objective``, ``arrays``), each trained from its own weights (a copy: the module given is left as
        it is) beside ``models`` (with ``models=None``, the family's default models, none for a family
        that declares none). A network that offers ``to_weights()`` giving the family's heads (those
        :func:`cvxtransformer.certify_network` takes), at which the family's objective is its own, gets a
        certified gap like the family's models; any other is compared with the convex optimum

    Returns
    -------
    Comparison
        Per model the objective curve, the final objective, the certified gap, test loss and
        accuracy; the convex solutions and certificates; ``plot(folder)``, ``save(folder)``,
        ``to_dict()`` (:class:`~cvxtransformer.comparison.result.Comparison`).

    Example
    -------
    >>> import cvxtransformer as ct
    >>> from cvxtransformer.datasets import student_teacher
    >>> X, Y = student_teacher(N=40, n=4, d=3, c=2, seed=0)
    >>> P = ct.make_problem(X, Y, program=10, beta=1.0)
    >>> out = ct.compare(P.with_beta(0.2 * P.beta_max()), models="alternative", steps=50)
    >>> run = out.models["alternative"]
    >>> run.certified_gap >= 0, run.certified_lower_bound == out.certificate.dual_objective
    (True, True)
    """
    return plan(problem, models=models, optimizer=optimizer, lr=lr, steps=steps, heads=heads, seed=seed,
                batch_size=batch_size, eval_every=eval_every, solver=solver, tol=tol, gates=gates,
                gate_seed=gate_seed, test=test, validation=validation, tune=tune,
                teacher_attention=teacher_attention, sequence=sequence, progress=progress, networks=networks).run()

