"""Train one deep network on one algorithmic task; record accuracy, loss and spectra.

Settings (the defaults are the full-run settings of ``docs/reproduction.md``):

* data: :func:`cvxtransformer.datasets.algorithmic.modular_division` or ``periodicity``,
  sequences ``[x, op, y, =]`` (n = 4, V = p + 2), ``train_fraction`` of the table for training;
* convex model: :class:`cvxtransformer.nn.deep.DeepConvexNetwork`, trained with Adam on
  docs/conventions.md's objective ``sum_i CE_i + beta * sum_layers sum_g ||z_g||`` (a mini-batch step uses
  ``(N / B) sum_batch CE_i + beta R``, divided by N: mean batch loss + ``(beta / N) R``);
  ``beta`` defaults to ``1e-3 N`` (``BETA_PER_SAMPLE``);
* standard model: :class:`cvxtransformer.nn.deep.StandardTransformer`, Adam with decoupled weight
  decay (AdamW, ``weight_decay``, as Power et al.) on the mean cross-entropy;
* both: same embedding size, learning rate, betas (0.9, 0.98), batch size and step budget.

Every ``eval_every`` steps (default: at most 200 evaluations, and at least
``3 (N_train + N_test) / batch`` steps apart, so evaluation costs at most about a third of
training) the full train and test sets are evaluated (mean cross-entropy and accuracy);
``steps_to_99_train`` / ``steps_to_99_test`` are the first evaluated steps with
accuracy >= 0.99 (so their resolution is ``eval_every``), None when not reached. With
``stop_at_99`` training stops at the first evaluation where both are reached. Every
``spectral_every`` steps the singular values of each layer's weight matrices are recorded
(:mod:`cvxtransformer.nn.spectral`).
"""
import json
import math
import os
import time
from dataclasses import asdict

import numpy as np
import torch

from ..core.io import json_ready, prepare_out_dir, save_npz, write_json
from ..nn.deep import build_model
from ..nn.spectral import SpectralTracker
from ..nn.trainer import fit
from .config import BETA_PER_SAMPLE, QUICK, RunConfig, config_from_args, default_eval_every  # noqa: F401


def load_task(config):
    """The data of a run: token ids and labels of both splits, as torch tensors."""
    from ..datasets import algorithmic

    make = algorithmic.modular_division if config.task == "division" else algorithmic.periodicity
    data = make(p=config.modulus, train_fraction=config.train_fraction, seed=config.seed, embedding_dim=1)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)
    return t(data.tokens_train), t(data.y_train), t(data.tokens_test), t(data.y_test)


@torch.no_grad()
def evaluate(net, tokens, y, chunk=2048):
    """Mean cross-entropy and accuracy of ``net`` on ``(tokens, y)``."""
    net.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), chunk):
        logits = net(tokens[start:start + chunk])
        loss += torch.nn.functional.cross_entropy(logits, y[start:start + chunk], reduction="sum").item()
        correct += (logits.argmax(dim=1) == y[start:start + chunk]).sum().item()
    net.train()
    return loss / len(y), correct / len(y)


def _first(steps, values, level=0.99):
    hit = [s for s, v in zip(steps, values) if v >= level]
    return int(hit[0]) if hit else None


def _optimizer(net, config, convex):
    """Adam (convex: the penalty is in the objective) or AdamW (standard: decoupled weight decay);
    the fused implementation where this torch has it (same updates, fewer passes over memory)."""
    cls, extra = (torch.optim.Adam, {}) if convex else (torch.optim.AdamW, {"weight_decay": config.weight_decay})
    try:
        return cls(net.parameters(), lr=config.lr, betas=(0.9, 0.98), fused=True, **extra)
    except (RuntimeError, TypeError):
        return cls(net.parameters(), lr=config.lr, betas=(0.9, 0.98), **extra)


def run(config, progress=False):
    """Train the network of ``config`` (a :class:`RunConfig`); return ``(metrics, spectra)``.

    ``metrics`` is the JSON-ready dict written to ``metrics.json`` (settings, results, curves,
    spectral summaries); ``spectra`` the :class:`SpectralTracker` (all singular values).
    """
    config.validate()
    tok_tr, y_tr, tok_te, y_te = load_task(config)
    N = len(y_tr)
    p = config.modulus
    net = build_model(config.model, p + 2, tok_tr.shape[1], p, dim=config.dim, layers=config.layers,
                      gates=config.gates, heads=config.heads, kernel_features=config.kernel_features,
                      sigma=config.sigma, seed=config.seed)
    convex = config.model == "convex"
    beta = (BETA_PER_SAMPLE * N if config.beta is None else config.beta) if convex else None
    eval_every = config.eval_every or default_eval_every(config)
    spectral_every = config.spectral_every or 2 * eval_every
    curves = {k: [] for k in ("step", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "penalty",
                              "seconds")}
    tracker = SpectralTracker()
    start_wall = time.perf_counter()

    def record(step, seconds):
        tr, te = evaluate(net, tok_tr, y_tr), evaluate(net, tok_te, y_te)
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
        return loss + (beta / N) * net.penalty() if convex else loss

    out = fit(_optimizer(net, config, convex), step_objective, N, config.steps, batch_size=min(config.batch_size, N),
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
        "best_test_accuracy": max(curves["test_accuracy"]),
        "train_seconds": out.seconds, "wall_seconds": time.perf_counter() - start_wall,
        "steps_per_second": done / out.seconds if out.seconds > 0 else None,
        "parameters": int(sum(p.numel() for p in net.parameters())),
        "curves": curves,
        "spectral": tracker.summary(),
    }
    return json_ready(metrics), tracker


def write_run(out_dir, metrics, tracker, plots=True):
    """Write ``metrics.json``, ``spectra.npz`` and the run's PNG plots into ``out_dir``.

    Returns the list of files written.
    """
    from . import plots as P

    prepare_out_dir(out_dir)
    files = [os.path.join(out_dir, "metrics.json"), os.path.join(out_dir, "spectra.npz")]
    write_json(files[0], metrics)
    save_npz(files[1], **tracker.arrays())
    if plots:
        for name, draw in (("accuracy.png", P.plot_accuracy), ("loss.png", P.plot_loss),
                           ("spectrum.png", P.plot_spectrum)):
            path = os.path.join(out_dir, name)
            draw([(metrics["label"], metrics)] if name != "spectrum.png" else metrics, path)
            files.append(path)
    return files


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


def run_and_write(config, out_dir, progress=False, log=print, reuse=False):
    """:func:`run` then :func:`write_run` into ``out_dir``; prints one line; returns the metrics.

    With ``reuse``, a finished run already in ``out_dir`` with the same settings is loaded
    instead of trained again (so a long suite can be split over several invocations).
    """
    config.validate()
    metrics = load_finished(out_dir, config) if reuse else None
    if metrics is None:
        metrics, tracker = run(config, progress=progress)
        write_run(out_dir, metrics, tracker)
    elif log:
        log(f"reusing the finished run in {out_dir}")
    if log:
        fmt = lambda v: "not reached" if v is None else v
        log(f"{config.task} mod {config.modulus}, {metrics['label']}: {metrics['status']} after "
            f"{metrics['steps_done']} steps ({metrics['train_seconds']:.1f} s); 99% train at "
            f"{fmt(metrics['steps_to_99_train'])}, 99% test at {fmt(metrics['steps_to_99_test'])}; "
            f"final test accuracy {metrics['final_test_accuracy']:.4f} -> {out_dir}")
    return metrics


def run_convex_pair(args, base, standard):
    """Train (or, with ``--reuse``, load) ``convex``, ``convex_kernel`` (Fastfood with
    ``--kernel-features`` features, default the embedding size) and, if ``standard``, the standard
    transformer with the settings ``base``, each into ``args.out_dir/<name>``; returns {name: metrics}."""
    D = args.kernel_features or base.get("dim", args.dim)
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
    out = {"task": cfg["task"], "modulus": cfg["modulus"], "layers": cfg["layers"], "model": cfg["model"],
           "kernel_features": cfg["kernel_features"], "label": metrics["label"], "status": metrics["status"]}
    for k in ("steps_done", "steps_to_99_train", "steps_to_99_test", "grokking_steps", "final_train_accuracy",
              "final_test_accuracy", "best_test_accuracy", "final_test_loss", "train_seconds", "wall_seconds",
              "steps_per_second"):
        out[k] = metrics[k]
    out.update(extra)
    return out
