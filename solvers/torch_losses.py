"""Torch forms of the losses of SPEC.md, for the proximal-gradient backend.

They mirror :mod:`cvxtransformer.losses` (same names, same conventions: summed over samples,
``V = -grad L``, dual term ``-L*(-V)``) and are checked against it by ``tests/test_fista.py``.
Every sum over samples is accumulated in float64 whatever the working dtype, so that a
float32 solve still reports an honest objective, dual objective and gap.

Shapes: ``Yhat``, ``T`` and ``V`` are tensors of shape (N, c); ``T`` holds the encoded targets
(the targets, labels in {-1, +1} as (N, 1), or one-hot rows).
"""
import torch

F64 = torch.float64


class TorchSquared:
    """``1/2 ||yhat - y||^2``; dual term ``<V, y> - 1/2 ||V||^2``."""

    name = "squared"
    curvature = 1.0  # Lipschitz constant of grad L in yhat

    @staticmethod
    def value(Yhat, T):
        r = Yhat - T
        return 0.5 * torch.sum(r * r, dtype=F64)

    @staticmethod
    def neg_grad(Yhat, T):
        return T - Yhat

    @staticmethod
    def dual_value(V, T, s=1.0):
        """``D(s V) = s <V, T> - s^2/2 ||V||^2`` (float64 scalar tensor)."""
        return s * torch.sum(V * T, dtype=F64) - 0.5 * s * s * torch.sum(V * V, dtype=F64)


class TorchLogistic:
    """``log(1 + exp(-y yhat))``; dual term ``H(y V)`` with H the binary entropy."""

    name = "logistic"
    curvature = 0.25

    @staticmethod
    def value(Yhat, T):
        return torch.sum(torch.logaddexp(torch.zeros_like(Yhat), -T * Yhat), dtype=F64)  # exact at any margin

    @staticmethod
    def neg_grad(Yhat, T):
        return T * torch.sigmoid(-T * Yhat)

    @staticmethod
    def dual_value(V, T, s=1.0):
        a = (s * T) * V
        return torch.sum(torch.special.entr(a), dtype=F64) + torch.sum(torch.special.entr(1.0 - a), dtype=F64)


class TorchCrossEntropy:
    """``logsumexp(yhat) - yhat_y``; dual term ``entropy(e_y - V)``."""

    name = "cross_entropy"
    curvature = 0.5  # the Hessian diag(p) - p p^T has norm <= 1/2

    @staticmethod
    def value(Yhat, T):
        lse = torch.logsumexp(Yhat, dim=1)
        return torch.sum(lse, dtype=F64) - torch.sum(T * Yhat, dtype=F64)

    @staticmethod
    def neg_grad(Yhat, T):
        # softmax by hand: torch.softmax splits even tiny inputs across threads, which stalls
        # for milliseconds per call on a loaded CPU
        E = torch.exp(Yhat - torch.amax(Yhat, dim=1, keepdim=True))
        return T - E / torch.sum(E, dim=1, keepdim=True)

    @staticmethod
    def dual_value(V, T, s=1.0):
        return torch.sum(torch.special.entr(T - s * V), dtype=F64)


TORCH_LOSSES = {cls.name: cls for cls in (TorchSquared, TorchLogistic, TorchCrossEntropy)}


def torch_loss(loss):
    """The torch form of a loss: a :class:`cvxtransformer.losses.Loss` or its name."""
    from cvxtransformer.losses import get_loss

    return TORCH_LOSSES[get_loss(loss).name]
