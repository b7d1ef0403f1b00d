"""The solves behind ``cvxtransformer grok-gates`` (:mod:`.gates`): a ReLU teacher's gates and random
gates for program (12) on one-hot tokens, solved along a path of beta and scored on the test split.

Example
-------
>>> import numpy as np
>>> from cvxtransformer.core.attention import AttentionProgram, sample_gates
>>> X = np.eye(5)[np.random.default_rng(0).integers(0, 5, (6, 4))]
>>> U1, U2 = sample_gates(3, 4, 5)
>>> Z = -np.ones((3, 2, 4, 5))
>>> ev = operand_evidence(AttentionProgram(12, X, 2, U1, U2), Z, X.argmax(axis=2), np.zeros(6, dtype=int))
>>> bool(np.all(ev <= 0))
True
"""
import json
import os
import time

import numpy as np
import torch

from ..core.problem import make_problem
from ..core.attention import gate_mask, sample_gates
from ..path import solve_path
from .config import RunConfig, task_title
from .runner import load_net, split_scores
from .stats import fmt_value


def operand_evidence(program, Z, tokens, y):
    """``sum_j M_ij (Z[j, y_i, 0, x_i] + Z[j, y_i, 2, y'_i])`` per sample (N,): the part of the logit of
    label ``y_i`` that comes from the operand tokens ``x_i = tokens[i, 0]``, ``y'_i = tokens[i, 2]``
    (one-hot inputs: ``<Z[j, l, k], e_v> = Z[j, l, k, v]``); ``program`` on those samples (its mask)."""
    Z = np.asarray(Z).reshape(program.canonical_shape)
    parts = Z[:, y, 0, tokens[:, 0]] + Z[:, y, 2, tokens[:, 2]]                  # (h, N)
    return np.einsum("ij,ji->i", program.mask, parts)


def scores(logits, y, tokens):
    """Accuracy (with Wilson interval) and mean rank of the true label on all rows and on the rows
    with ``x != 0`` and ``x = 0`` (:func:`.runner.split_scores`), from numpy logits (N, C)."""
    logits, yt = torch.as_tensor(logits), torch.as_tensor(y)
    true = logits.gather(1, yt[:, None])
    rank = 1 + (logits > true).sum(dim=1) + ((logits == true).sum(dim=1) - 1)
    return split_scores(torch.as_tensor(tokens), logits.argmax(dim=1) == yt, rank)


class Teacher:
    """A trained relu run (``grok --model relu --save-weights``) and its split, embedded one-hot.

    ``U1`` (h, n), ``U2`` (h, d): its activation pattern as bilinear gates on the one-hot tokens;
    ``importance`` (h,): ``||w_3j|| mean_i relu(pre_ij)`` over the training set.
    """

    def __init__(self, folder):
        from ..core.errors import InvalidInputError
        from ..datasets import algorithmic

        try:
            with open(os.path.join(folder, "metrics.json")) as f:
                self.metrics = json.load(f)
        except (OSError, ValueError):
            raise InvalidInputError(f"--teacher: no readable metrics.json in {folder!r}; pass the folder of a "
                                    "'grok --model relu --save-weights' run") from None
        self.config = RunConfig(**self.metrics["config"])
        if self.config.model != "relu":
            raise InvalidInputError(f"--teacher: expected a relu run, got --model {self.config.model} in {folder!r}")
        self.net = load_net(folder, self.config)
        c = self.config
        if c.task == "division":
            self.data = algorithmic.modular_division(c.modulus, c.train_fraction, c.seed, reading=c.reading)
        else:
            self.data = algorithmic.periodicity(c.modulus, c.train_fraction, c.seed)
        self.U1, self.U2 = self.net.gates()
        with torch.no_grad():
            pre = self.net.preactivations(torch.as_tensor(self.data.tokens_train)).double()
            self.importance = (torch.linalg.vector_norm(self.net.W3.double(), dim=1) * torch.relu(pre).mean(0)).numpy()
        mask = gate_mask(self.data.X_train, self.U1, self.U2)
        self.mask_agreement = float(np.mean(mask == (pre.numpy() >= 0)))

    def keep(self, K):
        """Indices of the K most important neurons."""
        return np.sort(np.argsort(-self.importance, kind="stable")[:K])

    @torch.no_grad()
    def pruned_scores(self, keep):
        """Test scores of the teacher with only the neurons ``keep``."""
        tokens = torch.as_tensor(self.data.tokens_test)
        pre = self.net.preactivations(tokens)[:, keep]
        logits = torch.relu(pre) @ self.net.W3[keep]
        return scores(logits.double().numpy(), self.data.y_test, self.data.tokens_test)

    @torch.no_grad()
    def coefficients(self, keep):
        """``Z`` (K, C, n, d) of program (12) with the gates ``keep`` whose network is the teacher
        restricted to those neurons: ``relu(u1^T X u2) w3 = 1[u1^T X u2 >= 0] <w3 (x) u1 (x) u2, X>``,
        so ``Z[j, l, k, v] = W3[j, l] U1[j, k] U2[j, v]``, a feasible point of the program."""
        W3 = self.net.W3.double().numpy()[keep]
        return np.einsum("jl,jk,jv->jlkv", W3, self.U1[keep], self.U2[keep])

    def summary(self):
        m = self.metrics
        return {"config": m["config"], "neurons": int(self.U1.shape[0]), "mask_agreement": self.mask_agreement,
                "final_test_accuracy": m["final_test_accuracy"],
                "final_test_accuracy_nonzero": m.get("final_test_accuracy_nonzero"),
                "steps_done": m["steps_done"], "task": task_title(m["config"])}


def load_teacher(folder):
    return Teacher(folder)


def best_scale(problem, Z):
    """``min_{a >= 0} P(a Z)``, its ``a``, and ``beta_T = <-grad L(0), A Z> / R_1(Z)`` (``R_1``: the
    regulariser at beta = 1): the largest beta at which moving from 0 along Z lowers P. P is convex
    in a, so for ``beta >= beta_T`` the minimum is at a = 0; below, a bounded search on log a."""
    from scipy.optimize import minimize_scalar

    zero = problem.zeros()
    slope = float(np.sum(problem.residual_dual(zero) * problem.program.forward(Z)))  # -dL(aAZ)/da at 0
    beta_T = slope / (problem.regularizer.value(Z) / problem.beta)
    if problem.beta >= beta_T:
        return float(problem.primal_objective(zero)), 0.0, beta_T
    res = minimize_scalar(lambda t: problem.primal_objective(np.exp(t) * Z), bounds=(-12.0, 6.0), method="bounded",
                          options=dict(xatol=1e-6))
    return float(res.fun), float(np.exp(res.x)), beta_T


def solve_gates(teacher, U1, U2, fractions, tol, options, reference=None, **row):
    """Program (12) with cross-entropy on the teacher's training split and gates ``U1``, ``U2``,
    solved at ``beta = f beta_max`` for each fraction f (one warm-started path); one dict per point.

    ``reference``: coefficients of the same gates (the teacher's own readout,
    :meth:`Teacher.coefficients`); each point then also reports ``P`` at its best multiple
    (:func:`best_scale`; ``reference_beta_fraction``: beta_T / beta_max), ``P(0)``, and the
    reference's own test accuracy, against the certified optimum ``objective``."""
    d = teacher.data
    p = teacher.config.modulus
    problem = make_problem(d.X_train, d.y_train, program=12, loss="cross_entropy", beta=1.0, U1=U1, U2=U2,
                           n_classes=p)
    beta_max = problem.beta_max()
    test = problem.program.on(d.X_test)
    start = time.perf_counter()
    points = solve_path(problem, betas=[f * beta_max for f in fractions], tol=tol, **options)
    fixed = {} if reference is None else dict(  # what does not depend on beta, once
        zero_objective=float(problem.primal_objective(problem.zeros())),
        reference_test_accuracy_nonzero=scores(test.forward(reference), d.y_test,
                                               d.tokens_test)["final_test_accuracy_nonzero"])
    out = []
    for f, point in zip(fractions, points):
        res, cert = point.result, point.result.certificate
        Z = res.Z
        train_acc = float(np.mean(problem.program.forward(Z).argmax(axis=1) == d.y_train))
        ev = operand_evidence(test, Z, d.tokens_test, d.y_test)[d.tokens_test[:, 0] != 0]
        extra = dict(fixed)
        if reference is not None:
            value, scale, beta_T = best_scale(problem.with_beta(point.beta), reference)
            extra.update(reference_objective=value, reference_scale=scale, reference_beta_fraction=beta_T / beta_max)
        out.append(dict(row, **extra, h=int(U1.shape[0]), beta=point.beta, beta_fraction=f, beta_max=beta_max,
                        objective=cert.primal_objective, relative_gap=cert.relative_gap,
                        certified=bool(cert.certified), status=res.status,
                        iterations=res.iterations, seconds=point.seconds, support=cert.support_size,
                        screened=point.screened, groups=point.n_blocks, train_accuracy=train_acc,
                        true_label_operand_evidence=float(ev.mean()) if ev.size else None,
                        operand_evidence_positive_fraction=float(np.mean(ev > 0)) if ev.size else None,
                        **scores(test.forward(Z), d.y_test, d.tokens_test)))
    out[-1]["path_seconds"] = time.perf_counter() - start
    return out


def sweep(teacher, oracle, random_h, seeds, fractions, tol, options, log=print, on_row=None):
    """Every gate set: the teacher's K most important neurons for K in ``oracle``, then h random
    gates for h in ``random_h`` and each seed in ``seeds``; returns the rows of :func:`solve_gates`
    (each also passed to ``on_row`` as soon as its path is solved)."""
    rows = []
    n, D = teacher.data.X_train.shape[1:]
    sets = []
    for K in oracle:
        K = min(K, teacher.U1.shape[0])
        keep = teacher.keep(K)
        pruned = teacher.pruned_scores(keep)
        sets.append((teacher.U1[keep], teacher.U2[keep], teacher.coefficients(keep),
                     dict(kind="oracle", seed=teacher.config.seed, split_seed=teacher.config.seed,
                          teacher_accuracy_nonzero=pruned["final_test_accuracy_nonzero"],
                          teacher_accuracy=pruned["final_test_accuracy"])))
    for h in random_h:
        for seed in seeds:
            U1, U2 = sample_gates(h, n, D, seed)
            sets.append((U1, U2, None, dict(kind="random", seed=seed, split_seed=teacher.config.seed)))
    for U1, U2, reference, row in sets:
        for r in solve_gates(teacher, U1, U2, fractions, tol, options, reference=reference, **row):
            rows.append(r)
            if on_row:
                on_row(r)
            if log:
                log(f"{r['kind']} gates h = {r['h']} (seed {r['seed']}), beta = {r['beta_fraction']:g} beta_max: "
                    f"relative gap {r['relative_gap']:.1e} ({'certified' if r['certified'] else 'NOT certified'}, "
                    f"{r['iterations']} iterations, {r['seconds']:.0f} s); train accuracy {r['train_accuracy']:.3f}, "
                    f"test x != 0 {fmt_value(r['final_test_accuracy_nonzero'])}, x = 0 {fmt_value(r['final_test_accuracy_zero'])}"
                    f", mean rank {r['true_label_mean_rank']:.1f}")
    return rows


def plot_gates(rows, teachers, path):
    """Accuracy on the ``x != 0`` test rows (left) and on the training set (right) against the number
    of gates h: random gates (circles, mean over seeds, bars min-max), the teachers' gates (stars,
    mean over teachers), one colour per beta / beta_max; the teachers' own accuracy dashed (mean),
    1/p dotted; the teachers restricted to their oracle gates (grey diamonds). ``teachers``: their
    :meth:`Teacher.summary` dicts (as in ``summary.json``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..core.io import save_figure

    fractions = sorted({r["beta_fraction"] for r in rows}, reverse=True)
    colors = {f: plt.cm.viridis(i / max(1, len(fractions) - 1)) for i, f in enumerate(fractions)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, ylabel in ((axes[0], "final_test_accuracy_nonzero", "test accuracy, rows with x != 0"),
                            (axes[1], "train_accuracy", "train accuracy")):
        for f in fractions:
            for kind, marker, ls in (("random", "o", "-"), ("oracle", "*", "none")):
                sel = [r for r in rows if r["kind"] == kind and r["beta_fraction"] == f and r[key] is not None]
                hs = sorted({r["h"] for r in sel})
                if not hs:
                    continue
                vals = [[r[key] for r in sel if r["h"] == h] for h in hs]
                mean = np.array([np.mean(v) for v in vals])
                err = np.array([[m - min(v) for m, v in zip(mean, vals)], [max(v) - m for m, v in zip(mean, vals)]])
                ax.errorbar(hs, mean, yerr=err, marker=marker, ls=ls, ms=10 if kind == "oracle" else 5,
                            color=colors[f], capsize=3, label=f"{kind} gates, beta = {f:g} beta_max")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("number of gates h")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    pruned = {}
    for r in rows:
        if r["kind"] == "oracle" and r.get("teacher_accuracy_nonzero") is not None:
            pruned.setdefault(r["h"], {})[r["seed"]] = r["teacher_accuracy_nonzero"]
    for h, by_seed in sorted(pruned.items()):
        axes[0].plot([h], [np.mean(list(by_seed.values()))], "D", color="gray", ms=7,
                     label="the teachers restricted to these gates" if h == min(pruned) else None)
    ts = teachers  # short name for the lines below
    accs = [t["final_test_accuracy_nonzero"] for t in ts if t["final_test_accuracy_nonzero"] is not None]
    if accs:
        axes[0].axhline(np.mean(accs), color="gray", ls="--", lw=1,
                        label=f"the ReLU teacher{'s' if len(ts) > 1 else ''} ({ts[0]['neurons']} neurons)")
    axes[0].axhline(1.0 / ts[0]["config"]["modulus"], color="gray", ls=":", lw=1, label="1/p")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=2)
    fig.suptitle(f"Program (12) on one-hot tokens, solved with certificates: {ts[0]['task']}"
                 + (f" (seeds {', '.join(str(t['config']['seed']) for t in ts)})" if len(ts) > 1 else ""))
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return fig
