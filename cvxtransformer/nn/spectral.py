"""Spectral analysis of weight matrices during training (Section 7 of the UCSD report).

For every tracked matrix ``W`` the singular values ``s_1 >= ... >= s_r`` are recorded at chosen
iterations, with two scalar summaries:

* effective rank (Roy & Vetterli, 2007): ``exp(H(p))``, ``p_i = s_i / sum_j s_j``, ``H`` the
  Shannon entropy; between 1 (one dominant direction) and ``r`` (flat spectrum). "Rank
  collapse" is a fall of this number;
* stable rank: ``sum_i s_i^2 / s_1^2 = ||W||_F^2 / ||W||_2^2``.

Example
-------
>>> import numpy as np
>>> round(effective_rank(np.ones(5)), 6), round(effective_rank(np.array([3.0, 0, 0])), 6)
(5.0, 1.0)
>>> tracker = SpectralTracker()
>>> tracker.record(0, {"W": np.eye(3)})
>>> [round(r, 6) for r in tracker.summary()["W"]["effective_rank"]]
[3.0]
"""
import numpy as np
import torch


def singular_values(W):
    """Singular values of a 2-d array or tensor (higher dimensions are flattened after the first),
    descending, as a float64 ndarray.

    Computed by ``torch.linalg.svdvals`` in float64, which follows ``torch.set_num_threads``
    (NumPy's threaded LAPACK can be very slow on a busy machine).
    """
    W = W.detach() if torch.is_tensor(W) else torch.as_tensor(np.asarray(W, dtype=float))
    W = W.reshape(W.shape[0], -1).to(dtype=torch.float64, device="cpu")
    if W.numel() == 0:
        return np.zeros(0)
    return torch.linalg.svdvals(W).numpy()


def effective_rank(s):
    """``exp(entropy(s / sum(s)))`` of singular values ``s`` (0 for a zero matrix)."""
    s = np.asarray(s, dtype=float)
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s[s > 0] / total
    return float(np.exp(-np.sum(p * np.log(p))))


def stable_rank(s):
    """``sum s_i^2 / max s_i^2`` (0 for a zero matrix)."""
    s = np.asarray(s, dtype=float)
    return float(np.sum(s ** 2) / s.max() ** 2) if s.size and s.max() > 0 else 0.0


class SpectralTracker:
    """Singular values of named matrices recorded over iterations.

    ``record(step, matrices)`` takes a dict name -> matrix (ndarray or tensor); the matrices'
    names and shapes must stay the same from call to call.
    """

    def __init__(self):
        self.steps = []
        self.values = {}

    def record(self, step, matrices):
        self.steps.append(int(step))
        for name, W in matrices.items():
            self.values.setdefault(name, []).append(singular_values(W))

    def effective_ranks(self, name):
        return np.array([effective_rank(s) for s in self.values[name]])

    def summary(self, top=16):
        """JSON-ready dict: per matrix its shape-independent summaries and the ``top`` singular values."""
        return {name: {"steps": list(self.steps),
                       "effective_rank": [effective_rank(s) for s in vals],
                       "stable_rank": [stable_rank(s) for s in vals],
                       "spectral_norm": [float(s[0]) if s.size else 0.0 for s in vals],
                       "top_singular_values": [s[:top].tolist() for s in vals]}
                for name, vals in self.values.items()}

    def arrays(self):
        """Dict of ndarrays for an .npz file: ``steps`` and ``<name>.singular_values`` (T, r)."""
        out = {"steps": np.asarray(self.steps, dtype=np.int64)}
        for name, vals in self.values.items():
            out[f"{name}.singular_values"] = np.stack(vals) if vals else np.zeros((0, 0))
        return out
