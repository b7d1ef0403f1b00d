"""Data-parallel certified solves over torch.distributed (gloo on the CPU, NCCL on GPUs).

The programs are separable in the samples: ``Z -> yhat`` and the loss are local to a shard of
rows, and everything else is a sum (or a maximum) over shards: ``A^T V``, ``P``, ``D``, Gram
matrices, block norms. So each process keeps only its rows, ``Z`` is replicated, and the torch
backend communicates Z-sized tensors and scalars (:class:`Shards`, one all-reduce each):

* a sharded problem (:func:`shard_problem`, :func:`shard_data`) is an ordinary
  :class:`~cvxtransformer.core.problem.ConvexProblem` whose program has ``shards`` set (its
  operators sum ``A^T V``, Gram matrices and block norms over the shards) and whose loss is a
  :class:`ShardedLoss` (values and dual objectives summed over the shards);
* :func:`cvxtransformer.solve` (``solver="fista"``), :func:`cvxtransformer.certify` and
  :func:`cvxtransformer.solve_path` then run unchanged on every process: the certificate is the
  verifier's own function on these sums, so every process returns the same Z, gap and
  certificate as one process would (to rounding). Screening, working sets, Gram matrices and the
  Newton polish all work across shards (their inputs are the summed quantities); every decision
  is taken from numbers that are identical on every process, and the iterates are checked to be
  identical at every certified check. The CVXPY solvers (Clarabel, SCS) cannot solve a sharded
  problem (they are refused by name).

Launch with ``torchrun --nproc-per-node K -m cvxtransformer solve DATA ... --solver fista
--distributed``, or in Python (every process, under torchrun)::

    import cvxtransformer as ct
    from cvxtransformer.solvers.distributed import init, shard_problem
    device = init()                                  # "cpu" (gloo) or "cuda:LOCAL_RANK" (NCCL)
    problem = shard_problem(ct.make_problem(X, y, program=10, beta=0.5))   # keeps this rank's rows
    result = ct.solve(problem, "fista", device=device)                     # V: this rank's rows

Failures: a process that dies closes its connections and every other process stops at its next
collective; one that hangs is detected after ``timeout`` seconds. Either way the others raise a
:class:`~cvxtransformer.core.errors.SolverError` naming the cause.
"""
import datetime
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist

from cvxtransformer.core import errors
from cvxtransformer.core.errors import CvxTransformerError, InvalidInputError, SolverError, invalid
from cvxtransformer.core.losses import Loss
from cvxtransformer.core.problem import ConvexProblem

TIMEOUT = 600.0  # seconds a process waits for the others in one collective
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init(device="cpu", timeout=TIMEOUT):
    """Join the process group that ``torchrun`` set up (its environment: RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK) and return this process's device: ``"cpu"`` (gloo) or
    ``"cuda:LOCAL_RANK"`` (NCCL for CUDA tensors, gloo for CPU ones). Does nothing but return the
    device when the default group already exists."""
    cuda = str(device).startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise invalid("device", "a device torch can use", f"{device!r} but torch sees no CUDA GPU")
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    elif str(device) != "cpu":
        raise invalid("device", '"cpu" or "cuda"', repr(device))
    if dist.is_initialized():
        return device
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise InvalidInputError(f"--distributed: no torchrun environment ({', '.join(missing)} unset); launch with "
                                "torchrun --nproc-per-node K -m cvxtransformer solve ... --distributed")
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as exc:
        raise SolverError(f"distributed: could not join the process group ({str(exc).splitlines()[0]})") from None
    return device


def finish():
    """Leave the process group (if any)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def collective(fn, *args, **kwargs):
    """Call the torch.distributed function ``fn``; a failed or timed-out collective (a process died,
    raised, or hangs) becomes a :class:`SolverError` saying so."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:  # gloo/NCCL: a peer closed its connection, or the timeout passed
        rank, size = dist.get_rank(), dist.get_world_size()
        raise SolverError(f"distributed: rank {rank} of {size} stopped: another process failed or did not "
                          f"answer in time ({str(exc).splitlines()[0][-160:]})") from None


def _everywhere(exc):
    """Mark ``exc`` as raised by every process alike (the command line prints it once, on rank 0)."""
    exc.every_process = True
    return exc


def agree(fn, *args, group=None, **kwargs):
    """Run ``fn`` on every process; if it raises a :class:`CvxTransformerError` on any of them, raise
    that error (same class, naming the rank) on all of them. Returns ``fn``'s result: checks made
    before any work fail on every process at once, never on one while the others wait."""
    try:
        out, failure = fn(*args, **kwargs), None
    except CvxTransformerError as exc:
        out, failure = None, (type(exc).__name__, str(exc))
    size = dist.get_world_size(group)
    failures = [None] * size
    collective(dist.all_gather_object, failures, failure, group=group)
    for rank, failure in enumerate(failures):
        if failure is not None:
            cls = getattr(errors, failure[0], CvxTransformerError)
            raise _everywhere(cls(failure[1] + ("" if size == 1 else f" (rank {rank})")))
    return out


def check_same(values, fix, group=None):
    """Check that every process holds the same ``values`` (a dict: what -> a comparable, picklable
    value: an option, a shape, a digest); otherwise raise, on every process alike, an
    :class:`InvalidInputError` naming the first item and the first rank that differs from rank 0,
    with both values, and ``fix``. One all-gather, before any work."""
    size = dist.get_world_size(group)
    seen = [None] * size
    collective(dist.all_gather_object, seen, list(values.items()), group=group)
    for rank in range(1, size):
        for (what, mine), (_, theirs) in zip(seen[0], seen[rank]):
            if mine != theirs:
                raise _everywhere(InvalidInputError(
                    f"distributed: rank {rank} differs from rank 0 in {what} ({_shown(theirs)} against "
                    f"{_shown(mine)} on rank 0); {fix}"))


def _shown(value):
    text = value.hex()[:12] if isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def digest(*arrays):
    """A short digest of arrays (dtype, shape and bytes): equal for equal arrays, different otherwise."""
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


PROBES = 8  # rows of each process's range whose digests every process compares


def data_fingerprint(data, size):
    """What every process must see alike in DATA before it reads its rows: N, the shapes and dtypes,
    the rows of each file (the split follows them), the rows ``[start, stop)`` of every process
    (they must tile ``[0, N)``), and digests of ``PROBES`` rows spread over every process's range,
    read by every process: a file that differs on one machine (a stale copy, regenerated data of
    the same shape) differs there. Data that differ only in rows no probe reads are not caught."""
    X0, y0 = data.parts[0]
    ranges = [data.split(size, r) for r in range(size)]
    probes = sorted({int(i) for s, e in ranges if e > s for i in np.linspace(s, e - 1, min(PROBES, e - s))})
    seen = {"N (rows of DATA)": data.N, "the shape of X": data.shape[1:], "the shape of y": y0.shape[1:],
            "the dtype of X": str(X0.dtype), "the dtype of y": str(y0.dtype), "rows per file": list(data.counts),
            "the rows of each process": ranges}
    for i in probes:
        seen[f"DATA row {i}"] = digest(*data.rows(i, i + 1))
    return seen


class Shards:
    """The data shards of one problem: ``counts[r]`` rows on rank r, and the reductions over them.

    ``sum_``/``max_`` reduce a tensor in place on every process (one all-reduce); a failed or
    timed-out collective raises :class:`SolverError`. ``bytes``/``calls`` count what this process
    sent to all-reduces (the message sizes), for the benchmarks.
    """

    def __init__(self, counts, group=None):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.counts = [int(c) for c in counts]
        if len(self.counts) != self.size or min(self.counts) < 0:
            raise invalid("counts", f"{self.size} row counts >= 0 (one per process)", repr(counts))
        self.total = sum(self.counts)
        self.start = sum(self.counts[:self.rank])
        self.stop = self.start + self.counts[self.rank]
        backend = str(dist.get_backend(group)).lower()
        self._devices = {"cpu"} if "nccl" not in backend else ({"cuda", "cpu"} if "gloo" in backend else {"cuda"})
        self.bytes = self.calls = 0
        self._carry = None  # a local sum that rides on the next float64 all-reduce (see carry)

    def __repr__(self):
        return f"Shards(rank {self.rank} of {self.size}, rows {self.start}:{self.stop} of {self.total})"

    def _reduce(self, t, op):
        carry, self._carry = self._carry, None
        if carry is not None and (op != dist.ReduceOp.SUM or t.dtype != torch.float64):
            raise RuntimeError("Shards.carry: the next reduction must be a float64 sum")
        buf = t
        if carry is not None:
            buf = torch.cat([t.reshape(-1), carry.reshape(1).to(t.device)])
        if buf.device.type not in self._devices:
            buf = buf.to("cuda" if buf.device.type == "cpu" else "cpu")
        elif not buf.is_contiguous():
            buf = buf.contiguous()
        collective(dist.all_reduce, buf, op=op, group=self.group)
        self.bytes += buf.numel() * buf.element_size()
        self.calls += 1
        if carry is not None:
            self.carried = buf[-1].to(carry.device)
            buf = buf[:-1].view(t.shape)
        if buf is not t:
            t.copy_(buf)
        return t

    def carry(self, value):
        """Let the local sum ``value`` (a 0-d float64 tensor) ride on the next all-reduce, which must
        be a float64 sum (an adjoint): its total is then :attr:`carried`. Saves one collective."""
        self._carry = value

    def sum_(self, t):
        """``t`` summed over the processes, in place; returns ``t``."""
        return self._reduce(t, dist.ReduceOp.SUM)

    def max_(self, t):
        """``t`` maximised over the processes, in place; returns ``t``."""
        return self._reduce(t, dist.ReduceOp.MAX)

    def sum_value(self, v):
        """A sum over samples computed on this shard (a float or a 0-d tensor), summed over the shards."""
        if isinstance(v, torch.Tensor):
            return self.sum_(v.reshape(1).clone())[0]
        return float(self.sum_(torch.tensor([float(v)], dtype=torch.float64))[0])

    def all_(self, flag):
        """Whether ``flag`` is true on every process."""
        return float(self.max_(torch.tensor([0.0 if flag else 1.0], dtype=torch.float64))[0]) == 0.0

    def any_(self, flag):
        """Whether ``flag`` is true on some process."""
        return not self.all_(not flag)

    def same(self, x):
        """Whether the replicated tensor ``x`` is the same on every process (two checksums)."""
        flat = x.reshape(-1).to(torch.float64)
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
        sums = torch.stack([flat.sum(), (flat * weights).sum()]).cpu()
        both = self.max_(torch.cat([sums, -sums]))
        return bool(torch.equal(both[:2], -both[2:]))

    def gather_rows(self, a):
        """The rows ``a`` (ndarray, this shard's) of every shard, concatenated in rank order on rank 0
        (None on the others)."""
        a = np.ascontiguousarray(a)
        rows = max(self.counts)
        buf = torch.zeros((rows,) + a.shape[1:], dtype=torch.float64)
        buf[:len(a)] = torch.from_numpy(a.astype(np.float64, copy=False))
        if "cpu" not in self._devices:
            buf = buf.cuda()
        parts = [torch.empty_like(buf) for _ in range(self.size)] if self.rank == 0 else None
        collective(dist.gather, buf, parts, dst=0, group=self.group)
        self.bytes += buf.numel() * buf.element_size()
        if self.rank != 0:
            return None
        return np.concatenate([p[:c].cpu().numpy() for p, c in zip(parts, self.counts)])

    def agree(self, fn, *args, **kwargs):
        """:func:`agree` on this problem's process group."""
        return agree(fn, *args, group=self.group, **kwargs)


class ShardedLoss(Loss):
    """A loss on one shard whose sums (``value``, ``dual_objective``, ``gradient_metric``, ``accuracy``) are
    summed over the shards; the per-sample faces (``dual_variable``, ``project_dual_domain``, ``hessian``)
    are the loss's own.
    It has no CVXPY faces: the CVXPY solvers refuse a sharded problem."""

    def __init__(self, loss, shards):
        if isinstance(loss, ShardedLoss):
            raise invalid("loss", "a loss of one process", "a loss already sharded")
        self.loss, self.shards = loss, shards
        self.name, self.quadratic = loss.name, loss.quadratic
        self.lipschitz, self.strong_concavity = loss.lipschitz, loss.strong_concavity

    def encode(self, y, n_classes=None):
        return self.loss.encode(y, n_classes)

    def value(self, Yhat, T):
        return self.shards.sum_value(self.loss.value(Yhat, T))

    def dual_variable(self, Yhat, T):
        return self.loss.dual_variable(Yhat, T)

    def dual_objective(self, V, T, scale=1.0):
        return self.shards.sum_value(self.loss.dual_objective(V, T, scale))

    def project_dual_domain(self, V, T):
        return self.loss.project_dual_domain(V, T)

    def hessian(self, Yhat, T):
        return self.loss.hessian(Yhat, T)

    def gradient_metric(self, Yhat, T, at=None):
        return self.shards.sum_value(self.loss.gradient_metric(Yhat, T, at))

    def accuracy(self, Yhat, T):
        local = float(self.loss.accuracy(Yhat, T)) if len(Yhat) else 0.0
        return self.shards.sum_value(local * len(Yhat)) / self.shards.total

    def __repr__(self):
        return f"ShardedLoss({self.loss!r}, {self.shards!r})"

    def __eq__(self, other):
        return isinstance(other, ShardedLoss) and self.loss == other.loss and self.shards is other.shards

    def __hash__(self):
        return hash((type(self.loss), id(self.shards)))


def _sharded(problem, shards, rows=None):
    """``problem`` (or the rows ``rows`` of its data) as a shard: its program sums over ``shards``."""
    program, T = problem.program, problem.T
    if rows is None and (program._ops or program.shards is not None):  # operators made unsharded: make new ones
        rows = slice(None)
    if rows is not None:
        program, T = program.on(program.X[rows]), T[rows]
    program.shards = shards
    return ConvexProblem(program, ShardedLoss(problem.loss, shards), T, problem.regularizer)


def shard_problem(problem, counts=None, group=None):
    """This process's rows of ``problem`` (built from the same data on every process).

    ``counts``: rows per process (default: contiguous, as even as possible); a process may have
    none. Returns a :class:`ConvexProblem` whose program and loss sum over the shards (see the
    module docstring). The default process group must exist (:func:`init`).
    """
    if isinstance(problem.loss, ShardedLoss):
        raise invalid("problem", "a problem of one process", "a sharded problem")
    size, rank, N = dist.get_world_size(group), dist.get_rank(group), problem.program.N
    if counts is None:
        counts = [N // size + (r < N % size) for r in range(size)]
    if sum(int(c) for c in counts) != N:
        raise invalid("counts", f"row counts adding up to N = {N}", repr(list(counts)))
    shards = Shards(counts, group)
    return _sharded(problem, shards, slice(shards.start, shards.stop))


def shard_data(data, build, group=None):
    """A sharded problem from a :class:`~cvxtransformer.core.data.DataSet`, each process reading only
    its rows (:meth:`DataSet.split`; memory maps stay memory maps).

    ``build(X, y, gates, max_label)`` makes the problem of some rows (``gates``: DATA's gate arrays by
    name, :attr:`DataSet.gates`; ``max_label``: the largest label over every shard, for the number of
    classes of the cross-entropy loss). Errors raised
    while building (bad values on one shard) are raised on every process. A process with no rows
    gets the problem's form from the first row of the data, and no samples.

    Before any row is read, every process checks that it sees the same DATA
    (:func:`data_fingerprint`); once built, that its program has the same gates
    (``program.gate_arrays()``). A difference is an error on every process, naming the rank.
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    check_same(data_fingerprint(data, size), "every process must read the same DATA (a stale or partial copy on "
               "one machine?)", group)
    counts = [e - s for s, e in (data.split(size, rank=r) for r in range(size))]
    shards = Shards(counts, group)
    X, y = data.rows(shards.start, shards.stop)
    top = float(np.max(y)) if y.size and y.dtype.kind in "biuf" and np.all(np.isfinite(y)) else -np.inf
    top = float(shards.max_(torch.tensor([top], dtype=torch.float64))[0])
    max_label = int(top) if np.isfinite(top) and top == int(top) else None

    def local():
        if len(X):  # a program just built: no operator made yet
            return _sharded(build(X, y, data.gates, max_label), shards)
        X1, y1 = data.rows(0, 1)
        return _sharded(build(X1, y1, data.gates, max_label), shards, slice(0, 0))

    problem = shards.agree(local)
    check_same({f"the gates {name} of {problem.program.label}": digest(U)
                for name, U in problem.program.gate_arrays().items()},
               "every process must use the same gates (the same DATA, --gates and --gate-seed)", group)
    return problem
