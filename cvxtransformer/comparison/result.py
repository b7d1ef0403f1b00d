"""The result of :func:`cvxtransformer.compare`: :class:`Comparison`, one :class:`ModelResult` per run."""
import math
import os
from dataclasses import dataclass

import numpy as np

from ..core.certificate import relative_gap
from .models import MODELS, equation


@dataclass
class ModelResult:
    """One trained model of a comparison.

    Attributes
    ----------
    name : the run's key and file name: the model (``"alternative"``), or ``"<model>_m<heads>"`` when
        it is trained with several head counts
    model : the row of :data:`cvxtransformer.comparison.models.MODELS`
    label : how plots and the report name it, e.g. ``"gated (11), m = 6"``
    train : :class:`cvxtransformer.nn.trainer.TrainResult`: the trained network and its history
    report : the entry of ``Comparison.to_dict()["models"]`` (objective, loss and regulariser apart,
        certified lower bound and gap, train/test loss and accuracy, ...)
    detail : what tuning chose (``"lr 0.01, beta 0.1 beta_max"``), or ""
    """

    name: str
    model: str
    label: str
    train: object
    report: dict
    detail: str = ""

    @property
    def network(self):
        """The trained torch module."""
        return self.train.network

    @property
    def objective(self):
        """Final objective ``sum_i L(yhat_i, y_i) + penalty`` on the training split."""
        return self.report["objective"]

    @property
    def curve(self):
        """``(seconds, objective)``: the objective against optimisation time, arrays of shape (S + 1,)."""
        return self.train.history.seconds, self.train.history.objective

    @property
    def certified_lower_bound(self):
        """D(V) of the bounding program's certificate (for (3): of the comparison's program, no bound)."""
        return self.report["certified_lower_bound"]

    @property
    def certified_gap(self):
        """``objective - D(V)``, a certified bound on the distance to the global optimum of the model's
        family; None where no convex program bounds the model (softmax attention (3))."""
        return self.report["certified_gap"]

    @property
    def test_loss(self):
        """Mean test loss per sample at the end (NaN without a test split)."""
        return self.report["test_loss"]

    @property
    def test_accuracy(self):
        """Test accuracy at the end (NaN for the squared loss or without a test split)."""
        return self.report["test_accuracy"]

    @property
    def legend(self):
        """The run's name in the plots: its label, what tuning chose, and a marker when it collapsed."""
        return (self.label + (f": {self.detail}" if self.detail else "")
                + (" [COLLAPSED]" if self.report.get("collapsed") else ""))


class Comparison:
    """Convex optima and trained networks on the same data (returned by :func:`cvxtransformer.compare`).

    Attributes
    ----------
    problem : the comparison's problem, at the reported beta (tuned: the beta chosen for the exact solution)
    problems, solutions, convex : program -> problem, :class:`~cvxtransformer.core.result.SolveResult`
        (with its certificate) and summary dict, for every program solved
    models : run name -> :class:`ModelResult`
    tuning : the grids, validation scores and choices of ``tune`` (None without)
    seconds : wall time of the whole comparison
    """

    def __init__(self, plan, problems, solutions, convex, models, tuning=None, all_certified=None):
        self.plan, self.problems, self.solutions, self.convex = plan, problems, solutions, convex
        self.models, self.tuning = models, tuning
        self.problem = problems[plan.problem.program.name]
        self.certified = all(r.certified for r in solutions.values()) if all_certified is None else all_certified
        self.seconds = None
        self._coefficients = {}

    @property
    def certificate(self):
        """The certificate of the comparison's program: ``primal_objective`` is P(Z*), ``dual_objective`` D(V)."""
        return self.solutions[self.problem.program.name].certificate

    def coefficients(self, name):
        """The coefficients that run ``name``'s trained network implements (``effective_coefficients``),
        computed once: at 24576 heads of (9) on d = 384 they take a minute, and the maps, the distances
        and the plots all read them."""
        if name not in self._coefficients:
            net = self.models[name].network
            self._coefficients[name] = net.effective_coefficients() if hasattr(net, "effective_coefficients") else \
                self.problem.reduction.coefficients(self.problem, net.to_weights())  # a network of the user's
        return self._coefficients[name]

    def attention_maps(self, per_output=True):
        """title -> ``(map, row label)`` for the group-lasso programs (None for the nuclear norm). A map
        has shape (rows, n): row r holds the weight of every input token k in output r. Maps: the token
        group norms of every convex solution and of the coefficients each network (9)/(11) implements,
        the mean softmax attention of (3), and the teacher's map when given. Rows: the output tokens
        with sequence targets; else one per output (per class of a classifier), or one for all with
        ``per_output=False``."""
        from ..core.regularizers import GroupLasso
        from .plots import convex_attention_map

        main = self.problem
        if not isinstance(main.regularizer, GroupLasso):
            return None
        n = main.program.X.shape[1]
        if self.plan.sequence:
            fold, rows = n, "output token t"
        else:
            fold = None if per_output else 1
            rows = ("class l" if main.loss.name == "cross_entropy" else "output l") if per_output else "all outputs"
        maps = {}
        if self.plan.teacher is not None:
            maps["teacher: the layer's softmax attention (mean over heads)"] = (
                self.plan.teacher[:n if self.plan.sequence else 1], rows if self.plan.sequence else "token 0 ([CLS])")
        for p, result in self.solutions.items():
            Z4 = result.Z.reshape(self.problems[p].program.canonical_shape)
            maps[f"convex ({p}), exact: token group norms"] = (convex_attention_map(Z4, fold), rows)
        for run in self.models.values():
            if run.model == "softmax":
                maps[f"{run.label}: mean softmax attention"] = (
                    run.network.attention_map(main.program.X), rows if self.plan.sequence else "token 0 (every output)")
            else:
                kind = f", {'Adam' if run.train.optimizer == 'adam' else 'SGD'}" if run.model == "convex" else ""
                maps[f"{run.label}{kind}: group norms"] = (
                    convex_attention_map(self.coefficients(run.name), fold), rows)
        return maps

    def distances(self):
        """Distance of every attention map to the teacher's (:func:`.plots.attention_distance`), None without one."""
        from .plots import attention_distance

        teacher, maps = self.plan.teacher, self.attention_maps(per_output=False)
        if teacher is None or maps is None:
            return None
        rows = teacher.shape[0] if self.plan.sequence else 1
        out = {k: attention_distance(v, teacher[:rows]) for k, (v, _) in maps.items() if not k.startswith("teacher")}
        out["uniform map (reference)"] = attention_distance(np.ones_like(teacher[:rows]), teacher[:rows])
        return out

    def to_dict(self):
        """Everything as JSON-ready Python (what ``compare --json`` prints, without ``files``/``out_dir``)."""
        from ..core.io import json_ready

        main, options = self.problem, self.plan.options
        top = self.convex[main.program.name]
        N, n, d = main.program.X.shape
        beta_max = float(main.beta_max())
        out = {"program": main.program.name, "loss": main.loss.name, "beta": top["beta"],
               "beta_max": beta_max if math.isfinite(beta_max) else None,
               "primal_objective": top["primal_objective"], "dual_objective": top["dual_objective"],
               "duality_gap": top["duality_gap"], "relative_gap": top["relative_gap"],
               "certified": top["certified"], "solve_seconds": top["solve_seconds"],
               "convex": self.convex, "models": {k: r.report for k, r in self.models.items()},
               "labels": {k: r.label for k, r in self.models.items()},
               "optimizer": options["optimizer"], "lr": None, "steps": options["steps"],
               "batch_size": options["batch_size"], "seed": self.plan.seed, "N": N, "n": n, "d": d,
               "splits": {"train": N, "validation": None if self.plan.validation is None else len(self.plan.validation[0]),
                          "test": None if self.plan.test is None else len(self.plan.test[0])},
               "sequence_targets": self.plan.sequence, "total_seconds": self.seconds}
        if self.tuning is None:
            out["lr"] = options["lr"]
        else:
            out.update(tuning=self.tuning, lr_grid=self.tuning["lr_grid"])
        distances = self.distances()
        if distances is not None:
            out["attention_distance_to_teacher"] = distances
        return json_ready(out)

    def plot(self, folder):
        """Write the PNG plots into ``folder`` (created if missing); returns their file names:
        ``objective.png``; ``attention.png`` (group-lasso programs) or ``singular_values.png`` (program
        (6); the gated MHSA program: one panel per gate); ``test_loss.png`` with a test split; ``tuning.png``
        with tuning."""
        from ..core.io import prepare_out_dir
        from .plots import plot_attention, plot_objective, plot_singular_values, plot_test_loss

        prepare_out_dir(folder, "folder")
        main = self.problem
        N = main.program.X.shape[0]
        files = ["objective.png"]
        plot_objective({r.legend: {
            "seconds": r.train.history.seconds, "objective": r.train.history.objective, "model": r.model,
            "lower_bound": r.certified_lower_bound if r.report["bound_applies"] else None,
            "bounding_program": r.report.get("bounding_program"), "eval_seconds": r.train.history.eval_seconds, "loss_sum": N * r.train.history.train_loss,
            "collapsed": r.report.get("collapsed", False)} for r in self.models.values()},
            {p: dict(c, label=self._convex_label(p, "P(Z*), certified")) for p, c in self.convex.items()},
            os.path.join(folder, files[-1]),
            title=f"Objective against time ({main.loss.name} loss"
                  + (f", beta = {main.beta:.4g})" if self.tuning is None else ")"))
        maps = self.attention_maps()
        if maps is None:
            files.append("singular_values.png")
            Z = self.solutions[main.program.name].Z
            nets = {r.legend: np.linalg.svd(self.coefficients(r.name), compute_uv=False)
                    for r in self.models.values() if r.report["bound_applies"]}
            plot_singular_values(np.linalg.svd(Z, compute_uv=False), nets, main.beta, os.path.join(folder, files[-1]),
                                 main.program.label)
        else:
            files.append("attention.png")
            marked = tuple(r.label + end for r in self.models.values() if r.report.get("collapsed") for end in ":,")
            plot_attention({t + (" [COLLAPSED]" if marked and t.startswith(marked) else ""): v
                            for t, v in maps.items()}, os.path.join(folder, files[-1]))
        if self.plan.test is not None:
            files.append("test_loss.png")
            plot_test_loss({r.legend: {"eval_seconds": r.train.history.eval_seconds,
                                       "test_loss": r.train.history.test_loss, "model": r.model}
                            for r in self.models.values()},
                           {p: {"test_loss": c["test_loss"], "label": self._convex_label(p)}
                            for p, c in self.convex.items()}, os.path.join(folder, files[-1]))
        if self.tuning is not None:
            from .plots import plot_grid

            files.append("tuning.png")
            plot_grid(self, os.path.join(folder, files[-1]))
        return files

    def _convex_label(self, p, what=""):
        frac = self.convex[p].get("beta_fraction")
        return (f"convex ({p}) exact" + (f", beta {frac:g} beta_max" if frac is not None else "")
                + (f": {what}" if what else ""))

    def save(self, folder, **extra):
        """Write into ``folder``: ``<run>.npz`` per model (weights, ``objective_history``,
        ``seconds_history``), ``convex_p<program>.npz`` (``convex_p10.npz``; ``convex_mhsa.npz``,
        ``convex_gated_mhsa.npz``; as ``solve --out``), the plots of :meth:`plot`
        and ``compare.json`` (:meth:`summary`, with the ``extra`` entries); returns the file names."""
        from ..core.io import prepare_out_dir, save_npz, write_json
        from ..core.registry import gate_arrays

        prepare_out_dir(folder, "folder")
        files = []
        for p, result in self.solutions.items():
            files.append(f"convex_p{p}.npz" if isinstance(p, int) else f"convex_{p}.npz")  # convex_gated_mhsa.npz
            result.save(os.path.join(folder, files[-1]))
        for name, r in self.models.items():
            arrays = r.network.arrays()
            arrays.update({k: getattr(r.network, k) for k in gate_arrays() if hasattr(r.network, k)})  # the gates
            files.append(f"{name}.npz")
            save_npz(os.path.join(folder, files[-1]), objective_history=r.train.history.objective,
                     seconds_history=r.train.history.seconds, **arrays)
        files += self.plot(folder) + ["compare.json"]
        write_json(os.path.join(folder, "compare.json"), self.summary(folder, files, **extra))
        return files

    def summary(self, folder=None, files=None, **extra):
        """:meth:`to_dict` with the output folder, the files written there and the ``extra`` entries."""
        out = self.to_dict()
        if folder is not None:
            out.update(out_dir=os.path.abspath(folder), files=files)
        out.update(extra)
        return out

    def __str__(self):
        return format_report(self.to_dict())


def format_report(s):
    """Human-readable comparison from :meth:`Comparison.to_dict`: one convex program, then one model a line."""
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    def accuracy(c, prefix=""):
        values = [(split, c.get(f"{split}_accuracy")) for split in ("train", "validation", "test")]
        values = [f"{split} {v:.4f}" for split, v in values if v is not None]
        return f", {prefix}accuracy {' / '.join(values)}" if values else ""

    beta = "beta tuned per model on the validation split" if s.get("tuning") else f"beta = {s['beta']:.6g}"
    lines = [f"convex program ({s['program']}), {s['loss']} loss, {beta} (beta_max = {fmt(s['beta_max'], '.6g')})"]
    for p, c in s["convex"].items():
        verdict = "CERTIFIED" if c["certified"] else "NOT CERTIFIED"
        lines.append(f"  program ({p}) at beta {c['beta']:.4g}: optimum P(Z*) = {c['primal_objective']:.10g} "
                     f"(loss {c['loss_sum']:.6g} + regulariser {c['regularizer']:.6g}), certified lower bound "
                     f"D(V) = {c['dual_objective']:.10g} (relative gap {c['relative_gap']:.1e}, {verdict}), "
                     f"test loss {fmt(c['test_loss'], '.4g')}{accuracy(c)}, {c['solve_seconds']:.3f} s")
    lines.append(f"networks trained by {s['optimizer']} ({s['steps']} steps):")
    labels, collapsed = s.get("labels", {}), []
    for name, m in s["models"].items():
        obj = "diverged" if m["objective"] is None else f"{m['objective']:.10g}"
        mark = ""
        if m.get("collapsed"):
            collapsed.append(f"  [{len(collapsed) + 1}] {labels.get(name, name)} COLLAPSED: {m['collapse_reason']}")
            mark = f" COLLAPSED [{len(collapsed)}]"
        head = (f"  {labels.get(name, name)}{mark}: lr {m['lr']:.2g}, beta {m['beta']:.4g}, objective {obj} "
                f"(loss {fmt(m['loss_sum'], '.6g')} + regulariser {fmt(m['regularizer'], '.4g')}), "
                f"test loss {fmt(m['test_loss'], '.4g')}{accuracy(m)}, ")
        if m["bound_applies"]:
            gap = "n/a" if m["certified_gap"] is None else (
                f"{m['certified_gap']:.4g} (relative {m['relative_certified_gap']:.2e})")
            lines.append(f"{head}certified gap {gap} over D(V) of program ({m['bounding_program']}), "
                         f"{m['seconds']:.2f} s")
        else:
            lines.append(f"{head}not covered by the bound; objective - convex optimum "
                         f"({m['compared_with_program']}) = {fmt(m['objective_minus_convex_optimum'], '+.4g')}, "
                         f"{m['seconds']:.2f} s")
    if collapsed:
        lines += ["collapsed networks (their numbers are those of a network that learned nothing):"] + collapsed
    if s.get("files"):
        lines.append(f"wrote {', '.join(s['files'])} in {s['out_dir']}")
    return "\n".join(lines)


def label(model, program, heads):
    """How a run is named in plots and the report: ``"alternative (9), m = 24"``, ``"softmax (3)"``; a model
    whose equation is its name is named once: ``"gated MHSA, m = 9"``."""
    eq = equation(model, program)
    name = eq[1:-1] if eq[1:-1].lower().replace(" ", "_") == model else f"{model} {eq}"
    return name + ("" if heads is None else f", m = {heads}")


def head_counts(plan, model, problem, solution):
    """The head counts ``model`` is trained with: the given ones, or its default; [None] when the
    model has no head count (softmax attention, the convex model)."""
    default = MODELS[model].default_heads if model in MODELS else None  # a network of the user's: as it is
    if default is None:
        return [None]
    return plan.heads or default(problem, solution)


def convex_summary(result, problem, test, val=None):
    """The certificate of an exact solve, with the training loss and the regulariser apart, and the
    validation and test loss (mean per sample) and accuracy."""
    cert = result.certificate
    out = {"beta": problem.beta, "primal_objective": cert.primal_objective, "dual_objective": cert.dual_objective,
           "duality_gap": cert.duality_gap, "relative_gap": cert.relative_gap, "certified": cert.certified,
           "residual_relative_gap": cert.residual_relative_gap, "dual_source": cert.dual_source,
           "support_size": cert.support_size, "heads_recovered": cert.heads_recovered,
           "solve_seconds": result.solve_seconds, "refine_seconds": cert.refine_seconds, "status": result.status}
    Yhat = problem.program.forward(result.Z)
    out["loss_sum"] = float(problem.loss.value(Yhat, problem.T))
    out["regularizer"] = float(problem.regularizer.value(result.Z))
    out["train_loss"], out["train_accuracy"] = problem.loss.metrics(Yhat, problem.T)
    for name, split in (("validation", val), ("test", test)):
        out[f"{name}_loss"] = out[f"{name}_accuracy"] = None
        if split is not None:
            out[f"{name}_loss"], out[f"{name}_accuracy"] = problem.loss.metrics(
                problem.program.on(split[0]).forward(result.Z), split[1])
    if val is None:
        del out["validation_loss"], out["validation_accuracy"]
    return out


def objective_parts(net, problem):
    """``(sum of losses, regulariser, max |yhat|)`` of a trained network on the training split, at ``problem.beta``."""
    import torch

    inputs = net.encode_inputs(problem.program.X)
    with torch.no_grad():
        T = torch.as_tensor(problem.T, dtype=net.dtype, device=net.device)
        Yhat = net(*inputs)
        return (float(problem.loss.value(Yhat, T)), float(net.penalty(problem.beta)),
                float(Yhat.abs().max()) if Yhat.numel() else 0.0)


ZERO_OUTPUT = 1e-6  # max |yhat| at most this fraction of max |T|: the network outputs zero
NETWORK_NOTE = ("a network of the user's (compare's networks) is bounded only where it offers to_weights() giving "
                "its family's heads, at which the family's objective is its own: this one does not")
ROUNDING = 1e-9  # relative difference of two objectives read as equal


def collapse_reasons(run, problem, max_output):
    """Why a trained network counts as collapsed (an empty list: it did not): its output is zero
    (``max |yhat| <= ZERO_OUTPUT max |T|``), its objective is the zero network's ``sum_i L(0, y_i)``
    (1/2 sum y^2 for the squared loss) to rounding, or the objective did not decrease from its start."""
    objective, start = run.objective, run.history.objective[0]
    if objective is None or not np.isfinite(objective):
        return []  # diverged: the status says so
    scale = float(np.max(np.abs(problem.T))) if problem.T.size else 0.0
    zero = float(problem.loss.value(np.zeros_like(problem.T), problem.T))
    reasons = []
    if max_output <= ZERO_OUTPUT * scale:
        reasons.append(f"zero output (max |yhat| = {max_output:.2g}, max |y| = {scale:.3g})")
    if abs(objective - zero) <= ROUNDING * max(1.0, abs(zero)):
        reasons.append(f"objective = the zero network's sum_i L(0, y_i) = {zero:.10g}")
    if objective >= start - ROUNDING * max(1.0, abs(start)):
        reasons.append(f"no decrease of the objective from its start ({start:.10g})")
    return reasons


def model_report(model, bound, run, problem, reference, program):
    """One model's entry of the report. ``bound``: its bounding problem (None for (3));
    ``reference``: the convex summary of the bounding program (or, for (3), of the comparison's
    ``program``) at this model's beta."""
    h = run.history
    loss_sum, regularizer, max_output = objective_parts(run.network, problem)
    reasons = collapse_reasons(run, problem, max_output)
    entry = {"network": equation(model, program), "beta": problem.beta, "lr": run.lr, "objective": run.objective,
             "loss_sum": loss_sum, "regularizer": regularizer, "seconds": run.seconds, "steps": run.steps,
             "status": run.status, "heads": getattr(run.network, "heads", 1), "max_abs_output": max_output,
             "collapsed": bool(reasons), "collapse_reason": "; ".join(reasons) or None}
    if bound is not None:
        lower = reference["dual_objective"]
        gap = run.objective - lower
        entry.update(bounding_program=bound.program.name, certified_lower_bound=lower, certified_gap=gap,
                     relative_certified_gap=relative_gap(run.objective, lower), bound_applies=True)
    else:
        optimum = reference["primal_objective"]
        entry.update(bounding_program=None, certified_lower_bound=reference["dual_objective"],
                     certified_gap=None, bound_applies=False, compared_with_program=program, convex_optimum=optimum,
                     objective_minus_convex_optimum=run.objective - optimum,
                     note=f"network {equation(model, program)} is not covered by the bound (docs/conventions.md): "
                          "the convex optimum is a comparison point, and certified_lower_bound is D(V) of that "
                          "program, not a bound on this network; " + ((MODELS[model].note if model in MODELS else
                                                                       NETWORK_NOTE) or
                          "its regulariser (weight decay) is not the convex one, so compare losses, not objectives"))
    entry.update(train_loss=h.train_loss[-1], test_loss=h.test_loss[-1], train_accuracy=h.train_accuracy[-1],
                 test_accuracy=h.test_accuracy[-1])
    return entry
