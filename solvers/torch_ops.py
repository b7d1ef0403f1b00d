"""Torch linear maps of programs (8), (10), (12) on chunks of samples, and their Gram matrices.

The map of program (12) restricted to gates ``J`` and tokens ``K`` is

    yhat_il = sum_{j in J} M_ij <Z[j, l], X_i[K]>,     Z of shape (|J|, c, |K|, d),

computed from ``X`` and the gate mask with one GEMM per chunk of samples: the gated design
(N x h*n*d) is never formed; only the Gram matrix of the squared loss is accumulated from a
chunk of it at a time. Programs (8) and (10) are the case of one gate that is always open.
"""
import numpy as np
import torch

from cvxtransformer.errors import invalid

CHUNK_BYTES = 8 * 2**20  # temporaries per chunk of samples


def resolve_device(device):
    """``torch.device`` from "cpu", "cuda" or "cuda:i"; errors name the argument."""
    if not isinstance(device, (str, torch.device)):
        raise invalid("device", '"cpu" or "cuda" (or "cuda:i")', repr(device))
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise invalid("device", '"cpu" or "cuda" (or "cuda:i")', repr(device)) from None
    if dev.type not in ("cpu", "cuda"):
        raise invalid("device", '"cpu" or "cuda"', repr(device))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise invalid("device", "a device torch can use", f"{device!r} but torch sees no CUDA GPU",
                          "use device='cpu' (or install a CUDA build of torch on a GPU machine)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise invalid("device", f"a CUDA index < {torch.cuda.device_count()}", repr(device))
    return dev


_DTYPES = {"float64": torch.float64, "double": torch.float64, "float32": torch.float32, "float": torch.float32}


def resolve_dtype(dtype):
    """``torch.float64`` or ``torch.float32`` from a name ("float64", "float32"), a torch or a numpy dtype."""
    if isinstance(dtype, torch.dtype):
        name = {torch.float64: "float64", torch.float32: "float32"}.get(dtype)
    elif isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in _DTYPES:
        raise invalid("dtype", '"float64" or "float32"', repr(dtype))
    return _DTYPES[name]


def device_budget(device):
    """Bytes of data that may live on ``device`` (half its free memory; unbounded on CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return float("inf")


class DataOp:
    """The map ``A: Z -> yhat`` of one program restricted to gates J and tokens K.

    Parameters
    ----------
    X : tensor of shape (N, n, d), every token, in the op's dtype; it lives on ``device`` or,
        when it does not fit there, on the CPU (chunks of samples are then streamed)
    K : tensor of token indices, or None for every token (then no copy is ever made); the
        tokens K of a chunk of samples are gathered when the chunk is used
    mask : tensor of shape (N, |J|) on ``device``, the gate columns J; None for (8)/(10)
    c : outputs
    chunk : samples per chunk (None: chosen so a chunk's temporaries stay small, a few MB: large
        fresh allocations cost page faults)
    """

    def __init__(self, X, K, mask, c, device, chunk=None):
        self.X, self.K, self.mask, self.c, self.device = X, K, mask, c, device
        self.N, n, self.d = X.shape
        self.nK = n if K is None else len(K)
        self.F = self.nK * self.d
        self.hJ = 1 if mask is None else mask.shape[1]
        self.dtype = X.dtype
        if chunk is None:
            copied = K is not None or X.device != device
            row = X.element_size() * (self.F * copied + 2 * self.hJ * c + 1)
            chunk = max(256, int(CHUNK_BYTES // row))
        self.chunk = min(int(chunk), self.N)
        self.bounds = [(s, min(s + self.chunk, self.N)) for s in range(0, self.N, self.chunk)]
        self._buffers = {}

    @property
    def shape(self):
        return (self.hJ, self.c, self.nK, self.d)

    def _buffer(self, name, shape, device):
        """A reused scratch tensor: fresh large allocations cost page faults at every chunk."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0]:
            buf = self._buffers[name] = torch.empty(shape, dtype=self.dtype, device=device)
        return buf[:shape[0]]

    def materialize(self):
        """The same op with its tokens K copied once into a contiguous tensor (many products ahead)."""
        if self.K is None:
            return self
        X = self.X.index_select(1, self.K)
        return DataOp(X, None, self.mask, self.c, self.device, None)

    def _x(self, s, e):
        """Rows s:e of the data, (rows, |K|*d), on the device."""
        Xc = self.X if (s, e) == (0, self.N) else self.X[s:e]
        if self.K is not None:
            out = self._buffer("x", (e - s, self.nK, self.d), Xc.device)
            Xc = torch.index_select(Xc, 1, self.K, out=out)
        return Xc.reshape(e - s, self.F).to(self.device, non_blocking=True)

    def forward(self, Z):
        """``yhat`` of shape (N, c) from ``Z`` of shape (|J|, c, |K|, d)."""
        W = Z.reshape(self.hJ * self.c, self.F).T
        if len(self.bounds) == 1:
            return self._gate(self._x(0, self.N) @ W, self.mask)
        out = torch.empty(self.N, self.c, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            out[s:e] = self._gate(self._x(s, e) @ W, None if self.mask is None else self.mask[s:e])
        return out

    def _gate(self, A, mask):
        if mask is None:
            return A
        return torch.einsum("ijl,ij->il", A.view(-1, self.hJ, self.c), mask)

    def _weights(self, V, s, e):
        """(rows, |J|*c): ``M_ij V_il`` for the samples of a chunk."""
        if self.mask is None:
            return V[s:e]
        return (self.mask[s:e, :, None] * V[s:e, None, :]).reshape(e - s, self.hJ * self.c)

    def adjoint(self, V):
        """``A^T V`` of shape (|J|, c, |K|, d) from ``V`` of shape (N, c)."""
        G = None
        for s, e in self.bounds:
            part = self._weights(V, s, e).T @ self._x(s, e)
            G = part if G is None else G.add_(part)
        return G.view(self.shape)

    def gram(self, T):
        """Gram matrix ``H = A_l^T A_l`` (F, F), shared by every output l, and ``B = A^T T`` (c, F).

        F = |J|*|K|*d, features ordered (gate, token, coordinate); accumulated over chunks of the
        gated design (never the whole of it), upper block triangle only, then mirrored.
        """
        Fg = self.hJ * self.F
        H = torch.zeros(Fg, Fg, dtype=self.dtype, device=self.device)
        B = torch.zeros(self.c, Fg, dtype=self.dtype, device=self.device)
        rows = max(256, int(CHUNK_BYTES // (self.X.element_size() * Fg)))
        step = Fg if Fg <= 256 else -(-Fg // 4 // self.d) * self.d  # four block rows, token-aligned
        for s0, e0 in self.bounds:
            Xc = self._x(s0, e0)
            for s in range(0, e0 - s0, rows):
                e = min(s + rows, e0 - s0)
                D = Xc[s:e]
                if self.mask is not None:
                    out = self._buffer("gated", (e - s, self.hJ, self.F), self.device)
                    D = torch.mul(self.mask[s0 + s:s0 + e, :, None], Xc[s:e, None, :], out=out).view(e - s, Fg)
                for i in range(0, Fg, step):
                    H[i:i + step, i:].addmm_(D[:, i:i + step].T, D[:, i:])
                B.addmm_(T[s0 + s:s0 + e].T, D)
        return torch.triu(H) + torch.triu(H, 1).T, B


def make_data_op(X, mask, c, J, K, device, dtype, chunk=None):
    """DataOp of the tokens ``K`` and gates ``J`` (index tensors) of ``X``, a tensor (N, n, d)
    already in ``dtype`` on its storage device; nothing is copied (see :meth:`DataOp.materialize`)."""
    n = X.shape[1]
    Kt = None if len(K) == n else torch.as_tensor(K, device=X.device)
    M = None
    if mask is not None:
        M = mask if len(J) == mask.shape[1] else mask.index_select(1, torch.as_tensor(J, device=mask.device))
    return DataOp(X, Kt, M, c, device, chunk)


def to_storage(X, device, dtype):
    """(N, n, d) numpy or tensor -> tensor in ``dtype`` on ``device`` when it fits there, else on
    the CPU (pinned, for CUDA streaming). Zero-copy for float64 numpy data on the CPU."""
    Xt = X if isinstance(X, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(X))
    fits = Xt.numel() * torch.finfo(dtype).bits // 8 <= device_budget(device)
    Xt = Xt.to(device=device if fits else "cpu", dtype=dtype)
    if not fits and device.type == "cuda":
        Xt = Xt.pin_memory()
    return Xt.contiguous()


def group_operator_norms(op):
    """``||A_g||`` for every block (j, k) of a DataOp, shape (|J|, |K|):
    ``sqrt(lambda_max(sum_i M_ij x_ik x_ik^T))``.

    Equal for every output l (the same data), as in ``Program.group_operator_norms``.
    """
    grams = torch.zeros(op.hJ, op.nK, op.d, op.d, dtype=op.dtype, device=op.device)
    for s, e in op.bounds:
        Xc = op._x(s, e).reshape(e - s, op.nK, op.d).transpose(0, 1)  # (K, rows, d)
        for j in range(op.hJ):  # one batched product per gate, never (J, K, rows, d)
            Xm = Xc if op.mask is None else Xc * op.mask[s:e, j][None, :, None]
            grams[j] += Xm.transpose(1, 2) @ Xc
    lam = torch.linalg.eigvalsh(grams.to(torch.float64))[..., -1]
    return torch.sqrt(torch.clamp(lam, min=0.0))
