"""Train one deep network on one algorithmic task; record accuracy, loss and spectra.

Settings (the defaults are the full-run settings of ``docs/reproduction.md``):

* data: :func:`cvxtransformer.datasets.algorithmic.modular_division` (under its ``reading``) or
  ``periodicity``, sequences ``[x, op, y, =]`` (n = 4, V = p + 2), ``train_fraction`` of the table
  for training;
* convex models (``convex``, ``convex-learned-gates``): :class:`cvxtransformer.nn.deep.DeepConvexNetwork`,
  trained with Adam on docs/conventions.md's objective ``sum_i CE_i + beta * sum_layers sum_g ||z_g||``
  (a mini-batch step uses ``(N / B) sum_batch CE_i + beta R``, divided by N: mean batch loss +
  ``(beta / N) R``); ``beta`` defaults to ``1e-3 N`` (``BETA_PER_SAMPLE``);
* ``relu`` (:class:`~cvxtransformer.nn.deep.ReLUNetwork`) and ``standard``
  (:class:`~cvxtransformer.nn.deep.StandardTransformer`): Adam with decoupled weight decay (AdamW,
  ``weight_decay``, as Power et al.) on the mean cross-entropy;
* ``ucsd`` (:class:`~cvxtransformer.nn.deep.UCSDNetwork`): the UCSD report's objective, mean batch
  cross-entropy + ``(beta / B) sum ||p||^2`` (``beta`` default 1e-4, B the batch size), Adam with
  weight decay 1e-6 (their Section 5.2);
* all: same embedding size, learning rate, betas (0.9, 0.98), batch size and step budget.

Every ``eval_every`` steps (default: at most 200 evaluations, and at least
``3 (N_train + N_test) / batch`` steps apart, so evaluation costs at most about a third of
training) the full train and test sets are evaluated (mean cross-entropy and accuracy);
``steps_to_99_train`` / ``steps_to_99_test`` are the first evaluated steps with
accuracy >= 0.99 (so their resolution is ``eval_every``), None when not reached. With
``stop_at_99`` training stops at the first evaluation where both are reached. Every
``spectral_every`` steps the singular values of each layer's weight matrices are recorded
(:mod:`cvxtransformer.nn.spectral`).

The test set is also scored on its rows with ``x != 0`` and ``x = 0`` (division: the ``x = 0``
rows are always labelled 0 under the default reading), with the rank of the true label among the
logits (1 = top) and a Wilson 95% interval on every final test accuracy
(:func:`.stats.wilson_interval`). Curves keep the accuracy on the ``x != 0`` rows.
"""
import json
import math
import os
import time
from dataclasses import asdict

import numpy as np
import torch

from ..core.io import json_ready, load_npz, prepare_out_dir, save_npz, write_json
from ..nn.deep import build_model
from ..nn.spectral import SpectralTracker
from ..nn.trainer import fit
from .config import (BETA_PER_SAMPLE, CONVEX_MODELS, QUICK, UCSD_BETA, RunConfig,  # noqa: F401
                     config_from_args, default_eval_every, task_title)
from .stats import fmt_value, wilson_interval


def load_task(config):
    """The data of a run: token ids and labels of both splits, as torch tensors."""
    from ..datasets import algorithmic

    if config.task == "division":
        data = algorithmic.modular_division(p=config.modulus, train_fraction=config.train_fraction,
                                            seed=config.seed, embedding_dim=1, reading=config.reading)
    else:
        data = algorithmic.periodicity(p=config.modulus, train_fraction=config.train_fraction, seed=config.seed,
                                       embedding_dim=1)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)
    return t(data.tokens_train), t(data.y_train), t(data.tokens_test), t(data.y_test)


@torch.no_grad()
def score(net, tokens, y, chunk=2048):
    """Mean cross-entropy of ``net`` on ``(tokens, y)``, and per row whether the prediction is right
    (bool, (N,)) and the rank of the true label among the logits (1 = top; ties count against it)."""
    net.eval()
    loss, correct, rank = 0.0, [], []
    for start in range(0, len(y), chunk):
        logits, yc = net(tokens[start:start + chunk]), y[start:start + chunk]
        loss += torch.nn.functional.cross_entropy(logits, yc, reduction="sum").item()
        correct.append(logits.argmax(dim=1) == yc)
        true = logits.gather(1, yc[:, None])
        rank.append(1 + (logits > true).sum(dim=1) + ((logits == true).sum(dim=1) - 1))
    net.train()
    return loss / len(y), torch.cat(correct), torch.cat(rank)


def evaluate(net, tokens, y, chunk=2048):
    """Mean cross-entropy and accuracy of ``net`` on ``(tokens, y)``."""
    loss, correct, _ = score(net, tokens, y, chunk)
    return loss, correct.double().mean().item()


def split_scores(tokens, correct, rank):
    """Accuracy, its Wilson 95% interval and the mean rank of the true label on all rows, on the
    rows with ``x != 0`` and on those with ``x = 0`` (``x`` the first operand, token 0); None where a
    part has no rows."""
    out = {}
    for part, rows in (("", slice(None)), ("_nonzero", tokens[:, 0] != 0), ("_zero", tokens[:, 0] == 0)):
        c, r = correct[rows], rank[rows]
        n, k = len(c), int(c.sum())
        out[f"final_test_accuracy{part}"] = k / n if n else None
        out[f"final_test_accuracy{part}_ci95"] = wilson_interval(k, n)
        out[f"true_label_mean_rank{part}"] = r.double().mean().item() if n else None
        out[f"n_test{part}"] = n
    return out


def _first(steps, values, level=0.99):
    hit = [s for s, v in zip(steps, values) if v >= level]
    return int(hit[0]) if hit else None


UCSD_WEIGHT_DECAY = 1e-6  # the UCSD report's Adam weight decay (their Section 5.2)


def _optimizer(net, config):
    """Adam (convex: the penalty is in the objective; ucsd: with weight decay 1e-6) or AdamW (relu,
    standard: decoupled weight decay); the fused implementation where this torch has it (same
    updates, fewer passes over memory)."""
    if config.model in CONVEX_MODELS:
        cls, extra = torch.optim.Adam, {}
    elif config.model == "ucsd":
        cls, extra = torch.optim.Adam, {"weight_decay": UCSD_WEIGHT_DECAY}
    else:
        cls, extra = torch.optim.AdamW, {"weight_decay": config.weight_decay}
    try:
        return cls(net.parameters(), lr=config.lr, betas=(0.9, 0.98), fused=True, **extra)
    except (RuntimeError, TypeError):
        return cls(net.parameters(), lr=config.lr, betas=(0.9, 0.98), **extra)


def run(config, progress=False, return_net=False):
    """Train the network of ``config`` (a :class:`RunConfig`); return ``(metrics, spectra)``, and the
    trained network as a third item with ``return_net``.

    ``metrics`` is the JSON-ready dict written to ``metrics.json`` (settings, results, curves,
    spectral summaries); ``spectra`` the :class:`SpectralTracker` (all singular values).
    """
    config.validate()
    tok_tr, y_tr, tok_te, y_te = load_task(config)
    N = len(y_tr)
    p = config.modulus
    net = build_model(config.model, p + 2, tok_tr.shape[1], p, dim=config.dim, layers=config.layers,
                      gates=config.gates, heads=config.heads, kernel_features=config.kernel_features,
                      sigma=config.sigma, seed=config.seed, hidden=config.hidden)
    convex = config.model in CONVEX_MODELS
    beta = {"ucsd": UCSD_BETA, **{m: BETA_PER_SAMPLE * N for m in CONVEX_MODELS}}.get(config.model)
    beta = config.beta if config.beta is not None and beta is not None else beta
    batch = min(config.batch_size, N)
    eval_every = config.eval_every or default_eval_every(config)
    spectral_every = config.spectral_every or 2 * eval_every
    curves = {k: [] for k in ("step", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                              "test_accuracy_nonzero", "penalty", "seconds")}
    tracker = SpectralTracker()
    start_wall = time.perf_counter()
    nonzero = tok_te[:, 0] != 0
    final = {}

    def record(step, seconds):
        tr = evaluate(net, tok_tr, y_tr)
        loss, correct, rank = score(net, tok_te, y_te)
        final.update(split_scores(tok_te, correct, rank))
        te = (loss, correct.double().mean().item(),
              correct[nonzero].double().mean().item() if bool(nonzero.any()) else None)
        with torch.no_grad():
            pen = float(net.penalty())
        for k, v in zip(curves, (step, *tr, *te, pen, seconds)):
            curves[k].append(v)
        if step % spectral_every == 0 or step == config.steps:
            tracker.record(step, net.weight_matrices())
        if not all(math.isfinite(v) for v in (tr[0], te[0])):
            return "diverged"
        if config.stop_at_99 and tr[1] >= 0.99 and te[1] >= 0.99:
            return "reached 99%"
        return None

    def step_objective(idx):
        loss = torch.nn.functional.cross_entropy(net(tok_tr[idx]), y_tr[idx])
        if convex:
            return loss + (beta / N) * net.penalty()
        return loss + (beta / batch) * net.penalty() if config.model == "ucsd" else loss

    out = fit(_optimizer(net, config), step_objective, N, config.steps, batch_size=batch,
              seed=config.seed, eval_every=eval_every, evaluate=record, time_limit=config.time_limit,
              threads=config.threads, progress=progress, desc=config.label)
    status = "budget" if out.status == "finished" else out.status
    if tracker.steps[-1] != curves["step"][-1]:
        tracker.record(curves["step"][-1], net.weight_matrices())
    s99_tr = _first(curves["step"], curves["train_accuracy"])
    s99_te = _first(curves["step"], curves["test_accuracy"])
    done = curves["step"][-1]
    metrics = {
        "config": asdict(config), "label": config.label, "status": status,
        "n_train": N, "n_test": len(y_te), "beta": beta, "eval_every": eval_every,
        "spectral_every": spectral_every, "steps_done": done,
        "steps_to_99_train": s99_tr, "steps_to_99_test": s99_te,
        "grokking_steps": None if s99_tr is None or s99_te is None else s99_te - s99_tr,
        "final_train_accuracy": curves["train_accuracy"][-1], "final_test_accuracy": curves["test_accuracy"][-1],
        "final_train_loss": curves["train_loss"][-1], "final_test_loss": curves["test_loss"][-1],
        **final,
        "best_test_accuracy": max(curves["test_accuracy"]),
        "train_seconds": out.seconds, "wall_seconds": time.perf_counter() - start_wall,
        "steps_per_second": done / out.seconds if out.seconds > 0 else None,
        "parameters": int(sum(p.numel() for p in net.parameters())),
        "curves": curves,
        "spectral": tracker.summary(),
    }
    return (json_ready(metrics), tracker, net) if return_net else (json_ready(metrics), tracker)


def write_run(out_dir, metrics, tracker, plots=True, net=None):
    """Write ``metrics.json``, ``spectra.npz``, the run's PNG plots and, when ``net`` is given, its
    parameters (``weights.npz``, see :func:`load_net`) into ``out_dir``.

    Returns the list of files written.
    """
    from . import plots as P

    prepare_out_dir(out_dir)
    files = [os.path.join(out_dir, "metrics.json"), os.path.join(out_dir, "spectra.npz")]
    write_json(files[0], metrics)
    save_npz(files[1], **tracker.arrays())
    if net is not None:
        files.append(os.path.join(out_dir, "weights.npz"))
        save_npz(files[-1], **{k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    if plots:
        for name, draw in (("accuracy.png", P.plot_accuracy), ("loss.png", P.plot_loss),
                           ("spectrum.png", P.plot_spectrum)):
            path = os.path.join(out_dir, name)
            draw([(metrics["label"], metrics)] if name != "spectrum.png" else metrics, path)
            files.append(path)
    return files


def load_net(out_dir, config):
    """The network of ``config`` with the parameters saved in ``out_dir/weights.npz``."""
    tensors = load_npz(os.path.join(out_dir, "weights.npz"), "WEIGHTS")
    p = config.modulus
    net = build_model(config.model, p + 2, 4, p, dim=config.dim, layers=config.layers, gates=config.gates,
                      heads=config.heads, kernel_features=config.kernel_features, sigma=config.sigma,
                      seed=config.seed, hidden=config.hidden)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()})
    return net


def load_finished(out_dir, config):
    """The metrics of a finished run in ``out_dir`` with exactly ``config``'s settings, else None."""
    path = os.path.join(out_dir, "metrics.json")
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return None
    if metrics.get("config") != asdict(config) or not os.path.exists(os.path.join(out_dir, "spectra.npz")):
        return None
    return metrics


def reached(step):
    """``"step 1500"``, or ``"not reached"`` for None (as in "99% test: not reached")."""
    return "not reached" if step is None else f"step {step}"


def run_and_write(config, out_dir, progress=False, log=print, reuse=False, save_weights=False):
    """:func:`run` then :func:`write_run` into ``out_dir``; prints one line; returns the metrics.

    With ``reuse``, a finished run already in ``out_dir`` with the same settings is loaded
    instead of trained again (so a long suite can be split over several invocations).
    ``save_weights`` also writes the trained parameters (``weights.npz``).
    """
    config.validate()
    metrics = load_finished(out_dir, config) if reuse else None
    if metrics is not None and save_weights and not os.path.exists(os.path.join(out_dir, "weights.npz")):
        metrics = None
    if metrics is None:
        metrics, tracker, net = run(config, progress=progress, return_net=True)
        write_run(out_dir, metrics, tracker, net=net if save_weights else None)
    elif log:
        log(f"reusing the finished run in {out_dir}")
    if log:
        log(f"{task_title(config)}, {metrics['label']}, seed {config.seed}: {metrics['status']} after "
            f"{metrics['steps_done']} steps ({metrics['train_seconds']:.1f} s); 99% train: "
            f"{reached(metrics['steps_to_99_train'])}, 99% test: {reached(metrics['steps_to_99_test'])}; "
            f"final test accuracy {metrics['final_test_accuracy']:.4f} (x != 0: "
            f"{fmt_value(metrics.get('final_test_accuracy_nonzero'))}) -> {out_dir}")
    return metrics


def run_convex_pair(args, base, standard):
    """Train (or, with ``--reuse``, load) ``convex``, ``convex_kernel`` (Fastfood with
    ``--kernel-features`` features, default the embedding size) and, if ``standard``, the standard
    transformer with the settings ``base``, each into ``args.out_dir/<name>``; returns {name: metrics}."""
    D = args.kernel_features or config_from_args(args, **base).dim
    configs = {"convex": config_from_args(args, model="convex", kernel_features=None, **base),
               "convex_kernel": config_from_args(args, model="convex", kernel_features=D, **base)}
    if standard:
        configs["standard"] = config_from_args(args, model="standard", kernel_features=None, **base)
    for cfg in configs.values():
        cfg.validate()
    prepare_out_dir(args.out_dir)
    return {name: run_and_write(cfg, os.path.join(args.out_dir, name), progress=args.progress, reuse=args.reuse)
            for name, cfg in configs.items()}


def row(metrics, **extra):
    """The per-run numbers of a summary table (no curves)."""
    cfg = metrics["config"]
    out = {"task": cfg["task"], "reading": cfg.get("reading", "invertible"), "modulus": cfg["modulus"],
           "train_fraction": cfg["train_fraction"], "seed": cfg["seed"], "layers": cfg["layers"], "model": cfg["model"],
           "kernel_features": cfg["kernel_features"], "label": metrics["label"], "status": metrics["status"]}
    for k in ("steps_done", "steps_to_99_train", "steps_to_99_test", "grokking_steps", "final_train_accuracy",
              "final_test_accuracy", "final_test_accuracy_ci95", "final_test_accuracy_nonzero",
              "final_test_accuracy_zero", "true_label_mean_rank", "best_test_accuracy", "final_test_loss",
              "train_seconds", "wall_seconds", "steps_per_second"):
        out[k] = metrics.get(k)
    out.update(extra)
    return out
