"""One training loop for every network: :func:`fit`, and :func:`train` for the networks of docs/conventions.md.

:func:`fit` owns what every run shares: mini-batches (a fresh permutation per epoch, seeded),
optimisation time (evaluations are not timed), periodic evaluation, a time limit, divergence
detection (a non-finite objective stops the run), torch threads and a progress bar.
:func:`train` (the comparison with the convex optimum) and the experiments' runner
(:mod:`cvxtransformer.experiments.runner`) are built on it.

:func:`train` minimises a network's weight-decay objective of docs/conventions.md,
``sum_i L(yhat_i, y_i) + penalty``, full-batch or with mini-batches (the batch loss is scaled by
``N / B`` so that the stochastic gradient is unbiased for the summed objective), and projects
the attention rows back onto the simplex after every step (projected gradient; a no-op for the
other networks). It records, against iterations and wall time, the full-data objective at every
step (the value compared with the certified bound) and, every ``eval_every`` steps, the train
(and test) mean loss per sample and accuracy.

Example
-------
>>> import numpy as np
>>> from cvxtransformer.nn.networks import AlternativeAttention
>>> X = np.random.default_rng(0).standard_normal((40, 4, 3)); T = X[:, 1, :2]
>>> run = train(AlternativeAttention(4, 3, 2, heads=8), X, T, "squared", beta=0.5, steps=50)
>>> run.history.objective.shape, bool(run.objective < run.history.objective[0])
((51,), True)
"""
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.errors import invalid
from ..core.losses import get_loss
from ..core.validation import check_allocation, check_beta, check_choice, check_positive, check_seed, format_bytes

OPTIMIZERS = ("adam", "sgd")


@dataclass
class FitOutcome:
    """How :func:`fit` ended.

    Attributes
    ----------
    steps : steps done
    seconds : optimisation time
    status : "finished", "time limit", "diverged", or the status a hook returned to stop the run
    values, times : the objective that each step minimised (before the step) and the optimisation
        time then (lists of length ``steps``, plus the diverged value when the run diverged)
    """

    steps: int
    seconds: float
    status: str
    values: list
    times: list


LOG_EVERY = 30.0  # seconds between the plain progress lines written where no bar can be drawn


class Progress:
    """The progress of a loop of ``total`` steps on ``stream`` (stderr), when ``show``: tqdm's bar on a
    terminal (or a notebook); elsewhere (a log file, a pipe), where each redraw of a bar would add to the
    log, one plain line every ``every`` seconds and one at the end, ``desc: step s/total, objective v, t s``.

    >>> import io
    >>> log = io.StringIO()  # not a terminal
    >>> p = Progress(3, "demo", True, stream=log)
    >>> for _ in range(3):
    ...     p.update(objective=1.5)
    >>> p.close()
    >>> log.getvalue().split(", ")[:2]  # then the seconds it took
    ['demo: step 3/3', 'objective 1.5']
    """

    def __init__(self, total, desc, show, every=LOG_EVERY, stream=None):
        self.total, self.desc, self.every, self.stream = total, desc, every, stream or sys.stderr
        self.step, self.info, self.start = 0, {}, time.perf_counter()
        notebook = any(c.__name__ == "tqdm_notebook" for c in tqdm.__mro__)  # tqdm.auto chose the notebook's
        bars = bool(show) and (notebook or _is_terminal(self.stream))
        self.bar = tqdm(total=total, desc=desc, leave=False, file=self.stream) if bars else None
        self.lines = bool(show) and not bars
        self.last = self.start

    def update(self, n=1, **info):
        """``n`` more steps done; ``info`` (e.g. ``objective=v``) is shown with them."""
        self.step += n
        self.info.update(info)
        if self.bar is not None:
            self.bar.update(n)
            if info:
                self.bar.set_postfix({k: f"{v:.6g}" for k, v in info.items()}, refresh=False)
        elif self.lines and time.perf_counter() - self.last >= self.every:
            self._line()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.lines:
            self._line()

    def _line(self):
        self.last = time.perf_counter()
        shown = "".join(f", {k} {v:.6g}" for k, v in self.info.items())
        of = "" if self.total is None else f"/{self.total}"
        print(f"{self.desc}: step {self.step}{of}{shown}, {self.last - self.start:.1f} s", file=self.stream, flush=True)


def tracked(items, desc, show):
    """``items`` one by one, their progress shown as :class:`Progress` shows it (``show``)."""
    bar = Progress(len(items) if hasattr(items, "__len__") else None, desc, show)
    try:
        for item in items:
            yield item
            bar.update()
    finally:
        bar.close()


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def fit(optimizer, step_objective, n_samples, steps, batch_size=None, seed=0, eval_every=1, evaluate=None,
        before_step=None, after_step=None, time_limit=None, threads=1, progress=False, desc=""):
    """Run ``steps`` optimisation steps of ``optimizer``.

    Parameters
    ----------
    optimizer : a ``torch.optim.Optimizer`` over the parameters
    step_objective : callable(idx) -> 0-d tensor, the objective of a mini-batch (``idx`` a tensor of
        sample indices) or of all samples (``idx`` None, when ``batch_size`` is None)
    n_samples : N
    steps : number of steps
    batch_size : None (full batch) or B: samples drawn from a permutation, reshuffled every epoch
        (``torch.Generator`` seeded with ``seed``)
    eval_every : ``evaluate(step, seconds)`` runs before step 0, every ``eval_every`` steps and at the
        end (after the last step, at a time limit or a divergence); untimed; it may return a status
        to stop the run (e.g. "reached 99%")
    before_step, after_step : optional callables, ``before_step(step)`` untimed (it may return a
        status to stop), ``after_step()`` timed (e.g. a projection)
    time_limit : stop when the optimisation time reaches it (seconds)
    threads : torch intra-op threads during the run (restored afterwards); None: torch's setting
    progress, desc : show the progress (:class:`Progress`: a bar on a terminal, plain lines in a log), with
        its description

    A non-finite step objective stops the run with status "diverged" (before the update).
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(check_seed("seed", seed))
    order, cursor, elapsed, status = None, n_samples, 0.0, "finished"
    values, times, evaluated = [], [], None
    bar = Progress(steps, desc, progress)
    step = 0
    try:
        for step in range(steps + 1):
            if time_limit is not None and elapsed >= time_limit and step < steps:
                status = "time limit"
                break
            if evaluate is not None and (step % eval_every == 0 or step == steps):
                evaluated = step
                stop = evaluate(step, elapsed)
                if stop:
                    status = stop
                    break
            if step == steps:
                break
            if before_step is not None:
                stop = before_step(step)
                if stop:
                    status = stop
                    break
            start = time.perf_counter()
            idx = None
            if batch_size is not None:
                if cursor + batch_size > n_samples:
                    order, cursor = torch.randperm(n_samples, generator=generator), 0
                idx = order[cursor:cursor + batch_size]
                cursor += batch_size
            optimizer.zero_grad(set_to_none=True)
            value = step_objective(idx)
            values.append(value.item())
            times.append(elapsed)
            if not math.isfinite(values[-1]):
                status = "diverged"
                break
            value.backward()
            optimizer.step()
            if after_step is not None:
                after_step()
            elapsed += time.perf_counter() - start
            bar.update(1, objective=values[-1])
        if evaluate is not None and evaluated != step:
            evaluate(step, elapsed)
    finally:
        bar.close()
        torch.set_num_threads(previous)
    return FitOutcome(steps=step, seconds=elapsed, status=status, values=values, times=times)


@dataclass
class TrainHistory:
    """What :func:`train` recorded.

    Attributes
    ----------
    iterations, objective, seconds : ndarrays of shape (S + 1,): the full-data objective before
        step t (the last entry: after the last step) and the optimisation time then
    eval_iterations, eval_seconds : the steps at which metrics were evaluated
    train_loss, test_loss : mean loss per sample there (test: NaN without test data)
    train_accuracy, test_accuracy : accuracy there (NaN for the squared loss or without test data)
    """

    iterations: np.ndarray
    objective: np.ndarray
    seconds: np.ndarray
    eval_iterations: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    eval_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    test_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_accuracy: np.ndarray = field(default_factory=lambda: np.zeros(0))
    test_accuracy: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class TrainResult:
    """A trained network, its final objective and its history.

    status : "finished", "time limit" or "diverged" (non-finite objective; training stopped)
    """

    network: torch.nn.Module
    objective: float
    seconds: float
    steps: int
    status: str
    history: TrainHistory
    optimizer: str
    lr: float
    batch_size: int = None
    seed: int = 0


def check_training_options(optimizer="adam", lr=1e-2, steps=1000, batch_size=None, eval_every=None,
                           time_limit=None, n_samples=None):
    """Validate the trainer's options (before any work is done); errors name the argument."""
    check_choice("optimizer", optimizer, OPTIMIZERS)
    lr = check_positive("lr", lr)
    steps = check_positive("steps", steps, integer=True)
    batch_size = check_positive("batch_size", batch_size, integer=True, none_ok=True)
    if batch_size is not None and n_samples is not None and batch_size > n_samples:
        raise invalid("batch_size", f"at most the number of samples N = {n_samples}", batch_size,
                      "leave it out for full-batch training")
    eval_every = check_positive("eval_every", eval_every, integer=True, none_ok=True)
    time_limit = check_positive("time_limit", time_limit, none_ok=True)
    return optimizer, lr, steps, batch_size, eval_every, time_limit


def make_optimizer(name, parameters, lr, momentum=0.0):
    """Adam or SGD (with ``momentum``) over ``parameters``. Adam is torch's fused kernel on CPU and CUDA: one
    pass over each parameter (on a CPU 7x faster than the default for 75 M parameters, 1.0 s against 7.4 s)."""
    if name == "adam":
        parameters = list(parameters)
        return torch.optim.Adam(parameters, lr=lr, fused=all(p.device.type in ("cpu", "cuda") for p in parameters))
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum)


STEP_MEMORY = 2.5  # peak of a training step / activations kept for the backward pass (2.1 measured on network (9))


def sample_bytes(network, inputs, T, loss, beta):
    """The bytes autograd keeps for the backward pass of the first sample's objective, parameters not
    counted. ``inputs``: ``network.encode_inputs(X)``; ``T``: the encoded targets as a tensor."""
    kept, parameters = [0], {p.data_ptr() for p in network.parameters()}

    def pack(t):
        if t.data_ptr() not in parameters:
            kept[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        network.objective(tuple(a[:1] for a in inputs), T[:1], loss, beta)
    return kept[0]


def check_memory(network, inputs, T, loss, beta):
    """Refuse, before any step, a network whose pass over all N samples (an evaluation of the
    objective, a full-batch step) would not fit in memory: ``STEP_MEMORY`` times the bytes autograd
    keeps for one sample's backward pass (:func:`sample_bytes`), times N. ``inputs``:
    ``network.encode_inputs(X)``; ``T``: the encoded targets as a tensor."""
    kept = sample_bytes(network, inputs, T, loss, beta)
    N, heads = len(T), getattr(network, "heads", None)
    need = STEP_MEMORY * kept * N

    def fix(room):
        fits = "" if heads is None else f"; about {max(0, int(0.9 * heads * room / need))} heads would fit"
        return "use fewer heads (compare --heads) or fewer samples" + fits

    check_allocation("network", need,
                     f"network {network.name}{'' if heads is None else f' with {heads} heads'} over N = {N} samples "
                     f"({format_bytes(kept)} per sample), which takes", fix)


def train(network, X, T, loss, beta, optimizer="adam", lr=1e-2, steps=1000, batch_size=None,
          seed=0, eval_every=None, X_test=None, T_test=None, time_limit=None, momentum=0.0,
          threads=1, progress=False):
    """Minimise ``network``'s objective on ``(X, T)`` with SGD or Adam.

    Parameters
    ----------
    network : a :class:`cvxtransformer.nn.networks.Network` (trained in place)
    X : ndarray of shape (N, n, d)
    T : ndarray of shape (N, c), targets encoded by the loss (``Loss.encode``)
    loss : loss name or :class:`cvxtransformer.core.losses.Loss`
    beta : float > 0, the weight-decay coefficient of the objective
    optimizer : "adam" or "sgd" (``momentum`` for SGD)
    lr : learning rate > 0 (the objective is a sum over samples: SGD needs ``lr`` ~ 1 / (N L))
    steps : number of steps >= 1
    batch_size : None (full batch) or mini-batch size in [1, N], reshuffled every epoch
    seed : seed of the mini-batch order
    eval_every : steps between metric evaluations (default ``max(1, steps // 100)``)
    X_test, T_test : optional test data, same conventions
    time_limit : stop after this much optimisation time (seconds)
    threads : torch intra-op threads while training (restored afterwards); 1 by default, since
        these networks are small and one thread is fastest and steady on a shared CPU; None
        leaves torch's setting
    progress : show the progress (a tqdm bar on a terminal, a plain line every 30 s in a log)

    Returns
    -------
    TrainResult
    """
    threads = check_positive("threads", threads, integer=True, none_ok=True)
    loss = get_loss(loss)
    T = np.asarray(T, dtype=float)
    if T.ndim != 2 or T.shape[1] != network.c:
        raise invalid("T", f"encoded targets of shape (N, {network.c}) (see Loss.encode)", f"shape {T.shape}")
    N = T.shape[0]
    optimizer, lr, steps, batch_size, eval_every, time_limit = check_training_options(
        optimizer, lr, steps, batch_size, eval_every, time_limit, N)
    beta = check_beta(beta)
    eval_every = eval_every or max(1, steps // 100)
    inputs = network.encode_inputs(X)
    if inputs[0].shape[0] != N:
        raise invalid("T", f"{inputs[0].shape[0]} rows (one per sample of X)", f"shape {T.shape}")
    T_t = torch.as_tensor(T, dtype=network.dtype, device=network.device)
    check_memory(network, inputs, T_t, loss, beta)
    test = None if X_test is None else (network.encode_inputs(X_test), np.asarray(T_test, dtype=float))
    opt = make_optimizer(optimizer, [p for p in network.parameters() if p.requires_grad], lr, momentum)
    full = []  # mini-batches: the full-data objective before each step, untimed
    evals = {k: [] for k in ("it", "sec", "train_loss", "train_acc", "test_loss", "test_acc")}

    def full_objective():
        with torch.no_grad():
            return network.objective(inputs, T_t, loss, beta).item()

    def evaluate(step, elapsed):
        with torch.no_grad():
            tr = loss.metrics(network(*inputs).cpu().numpy().astype(float), T)
            te = ((math.nan, math.nan) if test is None else
                  loss.metrics(network(*test[0]).cpu().numpy().astype(float), test[1]))
        for k, v in zip(evals, (step, elapsed, *tr, *te)):
            evals[k].append(v)

    def before_step(step):
        full.append(full_objective())
        return None if math.isfinite(full[-1]) else "diverged"

    def step_objective(idx):
        if idx is None:
            return network.objective(inputs, T_t, loss, beta)
        batch = tuple(a[idx] for a in inputs)
        return (N / len(idx)) * loss.value(network(*batch), T_t[idx]) + network.penalty(beta)

    out = fit(opt, step_objective, N, steps, batch_size=batch_size, seed=seed, eval_every=eval_every,
              evaluate=evaluate, before_step=None if batch_size is None else before_step,
              after_step=network.project_, time_limit=time_limit, threads=threads, progress=progress,
              desc=f"{network.name} ({optimizer})")
    objective = out.values if batch_size is None else full
    seconds = out.times + [out.seconds] * (len(objective) - len(out.times))
    if out.status == "diverged":  # the non-finite value is replaced by the final one
        objective, seconds = objective[:-1], seconds[:-1]
    final = full_objective()
    objective = np.asarray(objective + [final])
    seconds = np.asarray(seconds + [out.seconds])
    status = out.status if math.isfinite(final) else "diverged"
    done = len(objective) - 1
    history = TrainHistory(
        iterations=np.arange(done + 1), objective=objective, seconds=seconds,
        eval_iterations=np.asarray(evals["it"], dtype=int), eval_seconds=np.asarray(evals["sec"]),
        train_loss=np.asarray(evals["train_loss"]), test_loss=np.asarray(evals["test_loss"]),
        train_accuracy=np.asarray(evals["train_acc"]), test_accuracy=np.asarray(evals["test_acc"]))
    return TrainResult(network=network, objective=final, seconds=out.seconds, steps=done, status=status,
                       history=history, optimizer=optimizer, lr=lr, batch_size=batch_size, seed=int(seed))
