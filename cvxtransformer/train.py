"""Train a nonconvex network (:mod:`cvxtransformer.networks`) by SGD or Adam.

The trainer minimises the network's weight-decay objective of SPEC.md,
``sum_i L(yhat_i, y_i) + penalty``, full-batch or with mini-batches (the batch loss is
scaled by ``N / B`` so that the stochastic gradient is unbiased for the summed objective),
and projects the attention rows back onto the simplex after every step (projected
gradient; a no-op for the softmax network). It records, against iterations and wall time:

* the full-data objective at every step (the value compared with the certified bound);
* every ``eval_every`` steps, the train (and test) mean loss per sample and, for the
  logistic and cross-entropy losses, the accuracy.

``seconds`` counts optimisation time only: the extra full-data objective of mini-batch
runs and the evaluations are not counted. Runs are deterministic under ``seed`` (the
network's own seed sets its initialisation; ``seed`` here sets the mini-batch order).

Example
-------
>>> import numpy as np
>>> from cvxtransformer.networks import AlternativeAttention
>>> X = np.random.default_rng(0).standard_normal((40, 4, 3)); T = X[:, 1, :2]
>>> run = train(AlternativeAttention(4, 3, 2, heads=8), X, T, "squared", beta=0.5, steps=50)
>>> run.history.objective.shape, bool(run.objective < run.history.objective[0])
((51,), True)
"""
import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import invalid
from .losses import get_loss
from .networks import loss_sum

OPTIMIZERS = ("adam", "sgd")


@dataclass
class TrainHistory:
    """What :func:`train` recorded.

    iterations, objective, seconds : ndarrays of shape (S + 1,): the full-data objective
        before step t (the last entry: after the last step) and the optimisation time then
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


def metrics(loss, Yhat, T):
    """Mean loss per sample and accuracy (NaN for the squared loss) of predictions ``Yhat`` (N, c)."""
    loss = get_loss(loss)
    mean_loss = loss.value(Yhat, T) / Yhat.shape[0]
    if loss.name == "logistic":
        accuracy = float(np.mean(np.where(Yhat >= 0, 1.0, -1.0) == T))
    elif loss.name == "cross_entropy":
        accuracy = float(np.mean(np.argmax(Yhat, axis=1) == np.argmax(T, axis=1)))
    else:
        accuracy = math.nan
    return mean_loss, accuracy


def _positive(name, value, integer=False, allow_none=False):
    if value is None and allow_none:
        return None
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
        raise invalid(name, f"{'an integer' if integer else 'a finite number'} > 0", repr(value))
    return int(value) if integer else float(value)


def check_training_options(optimizer="adam", lr=1e-2, steps=1000, batch_size=None, eval_every=None,
                           time_limit=None, n_samples=None):
    """Validate the trainer's options (before any work is done); errors name the argument."""
    if optimizer not in OPTIMIZERS:
        raise invalid("optimizer", f"one of {OPTIMIZERS}", repr(optimizer))
    lr = _positive("lr", lr)
    steps = _positive("steps", steps, integer=True)
    batch_size = _positive("batch_size", batch_size, integer=True, allow_none=True)
    if batch_size is not None and n_samples is not None and batch_size > n_samples:
        raise invalid("batch_size", f"at most the number of samples N = {n_samples}", batch_size,
                      "leave it out for full-batch training")
    eval_every = _positive("eval_every", eval_every, integer=True, allow_none=True)
    time_limit = _positive("time_limit", time_limit, allow_none=True)
    return optimizer, lr, steps, batch_size, eval_every, time_limit


def train(network, X, T, loss, beta, optimizer="adam", lr=1e-2, steps=1000, batch_size=None,
          seed=0, eval_every=None, X_test=None, T_test=None, time_limit=None, momentum=0.0,
          threads=1, progress=False):
    """Minimise ``network``'s objective on ``(X, T)`` with SGD or Adam.

    Parameters
    ----------
    network : a :class:`cvxtransformer.networks.Network` (trained in place)
    X : ndarray of shape (N, n, d)
    T : ndarray of shape (N, c), targets encoded by the loss (``Loss.encode``)
    loss : loss name or :class:`cvxtransformer.losses.Loss`
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
    progress : show a tqdm progress bar

    Returns
    -------
    TrainResult
    """
    threads = _positive("threads", threads, integer=True, allow_none=True)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(network, X, T, loss, beta, optimizer, lr, steps, batch_size, seed, eval_every,
                      X_test, T_test, time_limit, momentum, progress)
    finally:
        torch.set_num_threads(previous)


def _train(network, X, T, loss, beta, optimizer, lr, steps, batch_size, seed, eval_every,
           X_test, T_test, time_limit, momentum, progress):
    loss = get_loss(loss)
    T = np.asarray(T, dtype=float)
    if T.ndim != 2 or T.shape[1] != network.c:
        raise invalid("T", f"encoded targets of shape (N, {network.c}) (see Loss.encode)", f"shape {T.shape}")
    N = T.shape[0]
    optimizer, lr, steps, batch_size, eval_every, time_limit = check_training_options(
        optimizer, lr, steps, batch_size, eval_every, time_limit, N)
    beta = _positive("beta", beta)
    eval_every = eval_every or max(1, steps // 100)
    inputs = network.encode_inputs(X)
    if inputs[0].shape[0] != N:
        raise invalid("T", f"{inputs[0].shape[0]} rows (one per sample of X)", f"shape {T.shape}")
    T_t = torch.as_tensor(T, dtype=network.dtype, device=network.device)
    test = None
    if X_test is not None:
        test = (network.encode_inputs(X_test), np.asarray(T_test, dtype=float))

    params = [p for p in network.parameters() if p.requires_grad]
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr)
    else:
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(int(seed))
    order, cursor = None, N

    objective, seconds = [], []
    evals = {k: [] for k in ("it", "sec", "train_loss", "train_acc", "test_loss", "test_acc")}
    elapsed, status = 0.0, "finished"

    def full_objective():
        with torch.no_grad():
            return network.objective(inputs, T_t, loss, beta).item()

    def evaluate(step):
        with torch.no_grad():
            tr = metrics(loss, network(*inputs).cpu().numpy().astype(float), T)
            te = ((math.nan, math.nan) if test is None else
                  metrics(loss, network(*test[0]).cpu().numpy().astype(float), test[1]))
        for k, v in zip(evals, (step, elapsed, *tr, *te)):
            evals[k].append(v)

    bar = tqdm(total=steps, desc=f"{network.name} ({optimizer})", disable=not progress, leave=False)
    for step in range(steps):
        if time_limit is not None and elapsed >= time_limit:
            status = "time limit"
            break
        if step % eval_every == 0:
            evaluate(step)
        current = None if batch_size is None else full_objective()  # not timed
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if batch_size is None:
            value = network.objective(inputs, T_t, loss, beta)
            current = value.item()
        else:
            if cursor + batch_size > N:
                order, cursor = torch.randperm(N, generator=generator), 0
            idx = order[cursor:cursor + batch_size]
            cursor += batch_size
            batch = tuple(a[idx] for a in inputs)
            value = (N / batch_size) * loss_sum(loss, network(*batch), T_t[idx]) + network.penalty(beta)
        objective.append(current)
        seconds.append(elapsed)
        if not math.isfinite(current):
            status = "diverged"
            break
        value.backward()
        opt.step()
        network.project_()
        elapsed += time.perf_counter() - start
        bar.update(1)
        if step % eval_every == 0:
            bar.set_postfix(objective=f"{current:.6g}", refresh=False)
    bar.close()
    final = full_objective()
    if status == "diverged":
        objective.pop()
        seconds.pop()
    objective.append(final)
    seconds.append(elapsed)
    if not math.isfinite(final):
        status = "diverged"
    done = len(objective) - 1
    evaluate(done)
    history = TrainHistory(
        iterations=np.arange(done + 1), objective=np.asarray(objective), seconds=np.asarray(seconds),
        eval_iterations=np.asarray(evals["it"], dtype=int), eval_seconds=np.asarray(evals["sec"]),
        train_loss=np.asarray(evals["train_loss"]), test_loss=np.asarray(evals["test_loss"]),
        train_accuracy=np.asarray(evals["train_acc"]), test_accuracy=np.asarray(evals["test_acc"]))
    return TrainResult(network=network, objective=final, seconds=elapsed, steps=done, status=status,
                       history=history, optimizer=optimizer, lr=lr, batch_size=batch_size, seed=int(seed))
