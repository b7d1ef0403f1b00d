"""Train one deep network on one algorithmic task; record accuracy, loss and spectra.

Settings (the defaults are the full-run settings of ``docs/reproduction.md``):

* data: :func:`cvxtransformer.datasets.algorithmic.modular_division` or ``periodicity``,
  sequences ``[x, op, y, =]`` (n = 4, V = p + 2), ``train_fraction`` of the table for training;
* convex model: :class:`cvxtransformer.deep.DeepConvexNetwork`, trained with Adam on
  SPEC.md's objective ``sum_i CE_i + beta * sum_layers sum_g ||z_g||`` (a mini-batch step uses
  ``(N / B) sum_batch CE_i + beta R``, divided by N: mean batch loss + ``(beta / N) R``);
  ``beta`` defaults to ``1e-3 N`` (``BETA_PER_SAMPLE``);
* standard model: :class:`cvxtransformer.deep.StandardTransformer`, Adam with decoupled weight
  decay (AdamW, ``weight_decay``, as Power et al.) on the mean cross-entropy;
* both: same embedding size, learning rate, betas (0.9, 0.98), batch size and step budget.

Every ``eval_every`` steps (default: at most 200 evaluations, and at least
``3 (N_train + N_test) / batch`` steps apart, so evaluation costs at most about a third of
training) the full train and test sets are evaluated (mean cross-entropy and accuracy);
``steps_to_99_train`` / ``steps_to_99_test`` are the first evaluated steps with
accuracy >= 0.99 (so their resolution is ``eval_every``), None when not reached. With
``stop_at_99`` training stops at the first evaluation where both are reached. Every
``spectral_every`` steps the singular values of each layer's weight matrices are recorded
(:mod:`cvxtransformer.spectral`).
"""
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
from tqdm.auto import tqdm

from ..deep import MODELS, build_model
from ..errors import InvalidInputError, invalid
from ..result import save_npz_atomic
from ..spectral import SpectralTracker

TASKS = ("division", "periodicity")
BETA_PER_SAMPLE = 1e-3  # default beta / N_train of the convex model


@dataclass
class RunConfig:
    """One training run. See the module docstring for the meaning of each setting."""

    task: str = "division"
    modulus: int = 97
    layers: int = 1
    model: str = "convex"
    train_fraction: float = 0.5
    steps: int = 3000
    seed: int = 0
    dim: int = 128
    gates: int = 8
    heads: int = 4
    kernel_features: int = None
    sigma: float = None
    lr: float = 1e-3
    beta: float = None
    weight_decay: float = 1.0
    batch_size: int = 512
    eval_every: int = None
    spectral_every: int = None
    stop_at_99: bool = True
    time_limit: float = None
    threads: int = 1

    @property
    def label(self):
        kernel = f"+kernel{self.kernel_features}" if self.kernel_features else ""
        return f"{self.model}{kernel} L={self.layers}"

    def validate(self):
        """Check every setting before any work is done; errors name the setting."""
        if self.task not in TASKS:
            raise invalid("task", f"one of {TASKS}", repr(self.task))
        if self.model not in MODELS:
            raise invalid("model", f"one of {MODELS}", repr(self.model))
        for name in ("modulus", "layers", "steps", "dim", "gates", "heads", "batch_size", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise invalid(name, "an integer >= 1", repr(v))
        for name in ("eval_every", "spectral_every", "kernel_features"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise invalid(name, "an integer >= 1 (or leave it out)", repr(v))
        for name, low in (("lr", 0.0), ("train_fraction", 0.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= low:
                raise invalid(name, f"a finite number > {low}", repr(v))
        if not self.train_fraction < 1:
            raise invalid("train_fraction", "a number in (0, 1)", repr(self.train_fraction))
        for name in ("beta", "sigma", "time_limit"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
                raise invalid(name, "a finite number > 0 (or leave it out)", repr(v))
        if not isinstance(self.weight_decay, (int, float)) or not self.weight_decay >= 0:
            raise invalid("weight_decay", "a number >= 0", repr(self.weight_decay))
        if self.model == "standard" and self.kernel_features is not None:
            raise invalid("kernel_features", "no kernel for the standard transformer", self.kernel_features,
                          "kernel preconditioning applies to --model convex")
        if self.model == "standard" and self.dim % self.heads:
            raise invalid("heads", f"a divisor of dim = {self.dim}", repr(self.heads))
        return self


def default_eval_every(config):
    """Default steps between evaluations: at most 200 evaluations per run, and at least
    ``3 (N_train + N_test) / batch`` steps apart (an evaluation costs about
    ``(N_train + N_test) / batch`` forward passes: at most about a third of the training work)."""
    p = config.modulus
    total = p * sum(1 for v in range(p) if math.gcd(v, p) == 1)     # both tasks: p phi(p) equations
    batch = min(config.batch_size, max(1, round(config.train_fraction * total)))
    return max(1, config.steps // 200, 3 * math.ceil(total / batch))


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
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _run(config, progress)
    finally:
        torch.set_num_threads(threads)


def _run(config, progress):
    tok_tr, y_tr, tok_te, y_te = load_task(config)
    N = len(y_tr)
    p = config.modulus
    net = build_model(config.model, p + 2, tok_tr.shape[1], p, dim=config.dim, layers=config.layers,
                      gates=config.gates, heads=config.heads, kernel_features=config.kernel_features,
                      sigma=config.sigma, seed=config.seed)
    convex = config.model == "convex"
    beta = (BETA_PER_SAMPLE * N if config.beta is None else config.beta) if convex else None
    opt = _optimizer(net, config, convex)
    batch = min(config.batch_size, N)
    eval_every = config.eval_every or default_eval_every(config)
    spectral_every = config.spectral_every or 2 * eval_every
    gen = torch.Generator().manual_seed(config.seed)
    order, cursor = None, N
    curves = {k: [] for k in ("step", "train_loss", "train_accuracy", "test_loss", "test_accuracy", "penalty",
                              "seconds")}
    tracker = SpectralTracker()
    train_seconds, status, step = 0.0, "budget", 0
    start_wall = time.perf_counter()

    def record(step):
        tr, te = evaluate(net, tok_tr, y_tr), evaluate(net, tok_te, y_te)
        with torch.no_grad():
            pen = float(net.penalty())
        for k, v in zip(curves, (step, *tr, *te, pen, train_seconds)):
            curves[k].append(v)
        return tr[1], te[1]

    bar = tqdm(total=config.steps, desc=config.label, disable=not progress, leave=False)
    for step in range(config.steps + 1):
        time_up = config.time_limit is not None and train_seconds >= config.time_limit
        if step % eval_every == 0 or step == config.steps or time_up:
            acc_tr, acc_te = record(step)
            if step % spectral_every == 0 or step == config.steps:
                tracker.record(step, net.weight_matrices())
            bar.set_postfix(train=f"{acc_tr:.3f}", test=f"{acc_te:.3f}")
            if not all(math.isfinite(v) for v in (curves["train_loss"][-1], curves["test_loss"][-1])):
                status = "diverged"
                break
            if config.stop_at_99 and acc_tr >= 0.99 and acc_te >= 0.99:
                status = "reached 99%"
                break
        if step == config.steps or time_up:
            status = "time limit" if time_up and step < config.steps else status
            break
        t0 = time.perf_counter()
        if cursor + batch > N:
            order, cursor = torch.randperm(N, generator=gen), 0
        idx = order[cursor:cursor + batch]
        cursor += batch
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(tok_tr[idx]), y_tr[idx])
        if convex:
            loss = loss + (beta / N) * net.penalty()
        loss.backward()
        opt.step()
        train_seconds += time.perf_counter() - t0
        bar.update(1)
    bar.close()
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
        "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - start_wall,
        "steps_per_second": done / train_seconds if train_seconds > 0 else None,
        "parameters": int(sum(p.numel() for p in net.parameters())),
        "curves": curves,
        "spectral": tracker.summary(),
    }
    return _finite(metrics), tracker


def _finite(obj):
    """NaN/Inf -> None, so that the JSON file is standard JSON."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def prepare_out_dir(path):
    """Create the output folder (and parents); a user error if that is impossible."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"--out-dir: cannot create folder {path!r} ({exc.strerror}); "
                                "pass a writable folder") from None
    if not os.access(path, os.W_OK):
        raise InvalidInputError(f"--out-dir: folder {path!r} is not writable; pass a writable folder")
    return path


def write_json_atomic(path, obj):
    """``json.dump`` to a temporary file in the same folder, renamed into place when complete."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_run(out_dir, metrics, tracker, plots=True):
    """Write ``metrics.json``, ``spectra.npz`` and the run's PNG plots into ``out_dir``.

    Returns the list of files written.
    """
    from . import plots as P

    prepare_out_dir(out_dir)
    files = [os.path.join(out_dir, "metrics.json"), os.path.join(out_dir, "spectra.npz")]
    write_json_atomic(files[0], metrics)
    save_npz_atomic(files[1], **tracker.arrays())
    if plots:
        for name, draw in (("accuracy.png", P.plot_accuracy), ("loss.png", P.plot_loss),
                           ("spectrum.png", P.plot_spectrum)):
            path = os.path.join(out_dir, name)
            draw([(metrics["label"], metrics)] if name != "spectrum.png" else metrics, path)
            files.append(path)
    return files


def config_from_args(args, **overrides):
    """A :class:`RunConfig` from parsed command-line arguments (see :func:`add_model_arguments`)."""
    values = {f.name: getattr(args, f.name) for f in fields(RunConfig) if hasattr(args, f.name)}
    values.update(overrides)
    if getattr(args, "no_early_stop", False):
        values["stop_at_99"] = False
    return RunConfig(**values)


QUICK = dict(steps=30, dim=16, gates=2, heads=2, batch_size=64, eval_every=5)


def add_task_arguments(parser, task_default, layers_default, kernel_help):
    """Options of the task and depth (``--task``, ``--modulus``, ``--layers``, ``--kernel-features``)."""
    parser.add_argument("--task", choices=TASKS, default=task_default,
                        help=f"division: (x / y) mod p; periodicity: the UCSD report's task (default {task_default})")
    parser.add_argument("--modulus", type=int, default=97, help="the modulus p (default 97)")
    parser.add_argument("--layers", type=int, default=layers_default,
                        help=f"number L of layers (default {layers_default})")
    parser.add_argument("--kernel-features", type=int, default=None, metavar="D", help=kernel_help)


def add_model_arguments(parser, steps_default):
    """Options shared by every experiment command (model sizes, optimiser, budget)."""
    g = parser.add_argument_group("model and training (shared by both models)")
    g.add_argument("--steps", type=int, default=steps_default, help=f"step budget per run (default {steps_default})")
    g.add_argument("--seed", type=int, default=0, help="seed of the split, initialisation, gates and batches")
    g.add_argument("--train-fraction", type=float, default=0.5, help="fraction of the table used for training")
    g.add_argument("--dim", type=int, default=128, help="embedding size of both models (default 128)")
    g.add_argument("--gates", type=int, default=8, help="gates h per convex layer (default 8)")
    g.add_argument("--heads", type=int, default=4, help="attention heads of the standard transformer (default 4)")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    g.add_argument("--beta", type=float, default=None,
                   help="group-penalty weight of the convex model in SPEC.md's summed objective (default 1e-3 N_train)")
    g.add_argument("--weight-decay", type=float, default=1.0,
                   help="AdamW weight decay of the standard model (default 1)")
    g.add_argument("--batch-size", type=int, default=512, help="mini-batch size (default 512; capped at N_train)")
    g.add_argument("--eval-every", type=int, default=None,
                   help="steps between evaluations (default max(steps/200, 3 (N_train + N_test) / batch))")
    g.add_argument("--spectral-every", type=int, default=None, help="steps between spectra (default 2 eval-every)")
    g.add_argument("--sigma", type=float, default=None, help="Fastfood bandwidth (default sqrt(dim))")
    g.add_argument("--no-early-stop", action="store_true", help="train the whole budget even after 99%% train and test")
    g.add_argument("--time-limit", type=float, default=None, help="training-time budget per run, seconds")
    g.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    g.add_argument("--quick", action="store_true",
                   help="pipeline check in seconds: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    g.add_argument("--progress", action="store_true", help="show a progress bar")
    g.add_argument("--reuse", action="store_true",
                   help="load runs already finished in DIR with the same settings instead of training them again")
    g.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the JSON and PNG outputs")


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
