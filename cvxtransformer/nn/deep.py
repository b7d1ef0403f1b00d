"""Deep networks on token sequences: stacked convex layers of program (12), and the standard
transformer they are compared with (the grokking experiments of Ergen et al., Figures 4-7, and
of the UCSD report).

Both map integer token sequences ``tokens`` of shape (N, n) (vocabulary V) to class logits of
shape (N, C), through learned token embeddings of size ``dim``.

:class:`ConvexLayer` is the map of program (12) (docs/conventions.md) as a torch layer: gate vectors
``U1`` (h, n), ``U2`` (h, d) fixed at random, coefficients ``Z`` of shape (h, c, n, d),

    yhat_il = sum_j M_ij <Z[j, l], X_i>,   M_ij = 1[u_1j^T X_i u_2j >= 0],

with the group penalty ``beta sum_{j,l,k} ||Z[j, l, k]||_2``. Optionally a fixed Fastfood map
(:mod:`cvxtransformer.fastfood`, eq. (9) of the UCSD report) is applied to every input token
first: the layer is then program (12) on ``phi(X)`` (gates included).

:class:`DeepConvexNetwork` stacks L of them. Layers 1..L-1 map a sequence (n, dim) to a
sequence (n, dim): program (12) with one target vector per output token, ``c = n * dim``,
outputs ``(t, l)`` flattened row-major as docs/conventions.md fixes for sequence targets. Layer L maps the
sequence to the C class logits (``c = C``). With ``L = 1`` the network is program (12) on the
embedded tokens. No residual connection, layer normalisation or softmax is used.

Convexity. The stack as a whole is NOT a convex program: the embeddings and the coefficients
of different layers multiply, and each layer's gates depend on the previous layers. Each layer
with the others fixed is: with the embeddings, the other layers' coefficients and the gate masks
of the later layers held fixed, the logits are a linear function of that layer's ``Z`` (every
later layer is linear in its input once its mask is fixed), so the training objective
``sum_i CE(logits_i, y_i) + beta sum_layers sum_g ||z_g||`` is a convex function of it. For
the last layer no mask needs freezing: the subproblem is exactly program (12) with the
cross-entropy loss on the features that reach it, which :meth:`DeepConvexNetwork.last_layer_problem`
builds as a :class:`cvxtransformer.ConvexProblem` (solvable and certifiable). For an earlier
layer the later masks are piecewise-constant functions of its output: the subproblem is convex
on each region where they do not change, which is what a gradient step sees (gates carry no
gradient). End-to-end training with Adam is therefore a nonconvex heuristic over convex blocks.

:class:`StandardTransformer` is the baseline: learned token and position embeddings, L
post-norm transformer blocks (softmax multi-head self-attention, residual connection, layer
normalisation, ReLU FCN of width 4 dim, residual connection, layer normalisation; no dropout),
logits read at the last token.

Example
-------
>>> import torch
>>> net = DeepConvexNetwork(vocab=10, n=4, classes=7, dim=8, layers=2, gates=3)
>>> net(torch.zeros((5, 4), dtype=torch.long)).shape
torch.Size([5, 7])
"""
import math

import numpy as np
import torch

from ..core.errors import invalid
from ..core.programs import gate_mask, gated_outputs, sample_gates
from ..core.validation import check_int
from .fastfood import Fastfood

MODELS = ("convex", "standard")


class ConvexLayer(torch.nn.Module):
    """The map of program (12) on a batch of sequences: (B, n, d) -> (B, c).

    Parameters
    ----------
    n, d : tokens and token dimension of the input
    c : outputs (``n_out * d_out`` for a sequence output, C for logits)
    gates : h, the number of gate vectors
    seed : seed of the gates (:func:`cvxtransformer.sample_gates`) and of the initial ``Z``
    kernel : optional :class:`Fastfood` map ``R^d -> R^D`` applied to every token first

    ``Z`` (h, c, n, D) is initialised N(0, 2 / (h n D)) so that outputs have about the scale
    of the input.
    """

    def __init__(self, n, d, c, gates, seed=0, kernel=None, dtype=torch.float32):
        super().__init__()
        self.n, self.d, self.c, self.h = n, d, c, gates
        self.kernel = kernel
        self.d_feat = d if kernel is None else kernel.D
        U1, U2 = sample_gates(gates, n, self.d_feat, seed)
        self.register_buffer("U1", torch.as_tensor(U1, dtype=dtype))
        self.register_buffer("U2", torch.as_tensor(U2, dtype=dtype))
        rng = np.random.default_rng(seed + 7919)
        Z = rng.standard_normal((gates, c, n, self.d_feat)) * math.sqrt(2.0 / (gates * n * self.d_feat))
        self.Z = torch.nn.Parameter(torch.as_tensor(Z, dtype=dtype))

    def features(self, X):
        """The data of the program: ``phi(X)`` with a kernel, ``X`` otherwise; shape (B, n, D)."""
        return X if self.kernel is None else self.kernel.torch_forward(X)

    def mask(self, F):
        """Gate mask (B, h) of program (12) on features ``F`` (:func:`cvxtransformer.core.programs.gate_mask`)."""
        return gate_mask(F, self.U1, self.U2)

    def forward(self, X, mask=None):
        """``yhat`` (B, c); ``mask`` (B, h) replaces the computed gate mask when given."""
        F = self.features(X)
        M = self.mask(F) if mask is None else mask
        A = F.reshape(F.shape[0], -1) @ self.Z.reshape(self.h * self.c, -1).T
        return gated_outputs(A, M, self.h, self.c)

    def forward_tokens(self, E, tokens, mask=None):
        """``forward(E[tokens])`` for token ids (B, n) and an embedding table E (V, d), computed
        through per-(position, token) tables: ``O(n V h c D + B n h c)`` instead of
        ``O(B n h c D)``, the same numbers to rounding. Returns ``(yhat (B, c), mask (B, h))``."""
        FE = self.features(E)                                              # (V, D)
        pos = torch.arange(self.n, device=tokens.device)[None, :]
        if mask is None:
            mask = gate_mask(FE[tokens], self.U1, self.U2)
        V = FE.shape[0]
        Zk = self.Z.permute(2, 3, 0, 1).reshape(self.n, self.d_feat, self.h * self.c)
        T = torch.bmm(FE.expand(self.n, V, self.d_feat), Zk)               # (n, V, h c): <Z[j, l, k], phi(e_v)>
        rows = tokens + V * pos                                            # row of (position k, token) in T
        A = torch.nn.functional.embedding_bag(rows, T.reshape(self.n * V, -1), mode="sum")
        return gated_outputs(A, mask, self.h, self.c), mask

    def penalty(self):
        """``sum_g ||z_g||_2`` over the groups (rows of length D) of ``Z``."""
        return torch.linalg.vector_norm(self.Z, dim=-1).sum()

    def weight_matrix(self):
        """``Z`` as the matrix of the layer's linear map per gate: shape (h c, n D)."""
        return self.Z.detach().reshape(self.h * self.c, -1)


class DeepConvexNetwork(torch.nn.Module):
    """L stacked convex layers of program (12) on learned embeddings (see the module docstring).

    Parameters
    ----------
    vocab : vocabulary size V (token ids in [0, V))
    n : sequence length
    classes : number C of classes
    dim : embedding size
    layers : L >= 1
    gates : gates h per layer
    kernel_features : None, or D: a Fastfood map R^dim -> R^D before every layer
    sigma : Fastfood bandwidth (default ``sqrt(dim)``: features then have the scale of the tokens)
    seed : seed of the embeddings, gates, Fastfood maps and initial coefficients
    """

    name = "convex"

    def __init__(self, vocab, n, classes, dim=64, layers=1, gates=8, kernel_features=None, sigma=None,
                 seed=0, dtype=torch.float32):
        super().__init__()
        for name, v, low in (("vocab", vocab, 1), ("n", n, 1), ("classes", classes, 2), ("dim", dim, 1),
                             ("layers", layers, 1), ("gates", gates, 1)):
            check_int(name, v, low)
        if kernel_features is not None:
            check_int("kernel_features", kernel_features, 1)
        self.n, self.classes, self.dim, self.L = n, classes, dim, layers
        gen = torch.Generator().manual_seed(seed)
        self.embedding = torch.nn.Parameter(torch.randn(vocab, dim, generator=gen, dtype=dtype))
        sigma = math.sqrt(dim) if sigma is None else sigma
        blocks = []
        for layer in range(layers):
            kernel = None if kernel_features is None else Fastfood(dim, kernel_features, sigma, seed=seed + 101 * layer)
            c = classes if layer == layers - 1 else n * dim
            blocks.append(ConvexLayer(n, dim, c, gates, seed=seed + 1000 * (layer + 1), kernel=kernel, dtype=dtype))
        self.blocks = torch.nn.ModuleList(blocks)

    def embed(self, tokens):
        return self.embedding[tokens]

    def forward(self, tokens, masks=None, return_masks=False):
        """Logits (N, C). ``masks``: a list of L gate masks (or None entries) to hold fixed."""
        used, X = [], None
        for layer, block in enumerate(self.blocks):
            given = None if masks is None else masks[layer]
            if layer == 0:  # the input is an embedding lookup: use the per-token tables
                Y, M = block.forward_tokens(self.embedding, tokens, mask=given)
            else:
                M = block.mask(block.features(X)) if given is None else given
                Y = block(X, mask=M)
            used.append(M)
            X = Y if layer == self.L - 1 else Y.reshape(-1, self.n, self.dim)
        return (X, used) if return_masks else X

    def penalty(self):
        """``sum_layers sum_g ||z_g||_2``: the group penalty of docs/conventions.md summed over the layers."""
        return sum(block.penalty() for block in self.blocks)

    def objective(self, tokens, y, beta, masks=None):
        """docs/conventions.md's objective: ``sum_i CE(logits_i, y_i) + beta * penalty`` (summed over samples)."""
        logits = self(tokens, masks=masks)
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum") + beta * self.penalty()

    def weight_matrices(self):
        """Named matrices for the spectral analysis: each layer's ``Z`` as (h c, n D)."""
        return {f"layer{i + 1}.Z": block.weight_matrix() for i, block in enumerate(self.blocks)}

    @torch.no_grad()
    def last_layer_problem(self, tokens, y, beta):
        """The last layer's training problem with everything else fixed, as program (12).

        Returns ``(problem, Z)``: a :class:`cvxtransformer.ConvexProblem` (program (12),
        cross-entropy, the features reaching the last layer as ``X``, its gates ``U1``, ``U2``)
        and the layer's current coefficients (h, C, n, D) as float64. ``problem.primal_objective(Z)``
        equals :meth:`objective` (to rounding); the problem can be solved and certified.
        """
        from ..core.problem import make_problem

        X = self.embed(tokens)
        for block in self.blocks[:-1]:
            X = block(X).reshape(-1, self.n, self.dim)
        last = self.blocks[-1]
        F = last.features(X).double().cpu().numpy()
        problem = make_problem(F, np.asarray(y), program=12, loss="cross_entropy", beta=beta,
                               U1=last.U1.double().cpu().numpy(), U2=last.U2.double().cpu().numpy(),
                               n_classes=self.classes)
        return problem, last.Z.detach().double().cpu().numpy()

    def extra_penalty(self):
        """The penalty of the layers other than the last (a constant of the last layer's problem)."""
        return sum(block.penalty() for block in self.blocks[:-1])


class StandardTransformer(torch.nn.Module):
    """The baseline: embeddings + L post-norm transformer blocks + a linear readout at the last token.

    Block: ``x = LN(x + MHA(x)); x = LN(x + W2 relu(W1 x))`` (softmax multi-head self-attention with
    ``heads`` heads, FCN width ``4 dim``, no dropout), as ``torch.nn.TransformerEncoderLayer``.
    """

    name = "standard"

    def __init__(self, vocab, n, classes, dim=64, layers=1, heads=4, seed=0, dtype=torch.float32):
        super().__init__()
        for name, v, low in (("vocab", vocab, 1), ("n", n, 1), ("classes", classes, 2), ("dim", dim, 1),
                             ("layers", layers, 1), ("heads", heads, 1)):
            check_int(name, v, low)
        if dim % heads:
            raise invalid("heads", f"a divisor of dim = {dim}", repr(heads))
        self.n, self.classes, self.dim, self.L = n, classes, dim, layers
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, global RNG untouched
            torch.manual_seed(seed)
            self.token_embedding = torch.nn.Embedding(vocab, dim, dtype=dtype)
            self.position_embedding = torch.nn.Parameter(torch.randn(n, dim, dtype=dtype) * 0.02)
            self.blocks = torch.nn.ModuleList([
                torch.nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0,
                                                 activation="relu", batch_first=True, dtype=dtype)
                for _ in range(layers)])
            self.readout = torch.nn.Linear(dim, classes, dtype=dtype)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding
        for block in self.blocks:
            x = block(x)
        return self.readout(x[:, -1])

    def penalty(self):
        """``1/2 sum ||W||_F^2`` over all parameters (the weight decay, applied decoupled by AdamW)."""
        return 0.5 * sum(torch.sum(p ** 2) for p in self.parameters())

    def weight_matrices(self):
        """Named matrices: per block W_q, W_k, W_v, W_o, FCN W_1, W_2; and the readout."""
        out = {}
        for i, block in enumerate(self.blocks):
            Wq, Wk, Wv = block.self_attn.in_proj_weight.detach().chunk(3, dim=0)
            out.update({f"layer{i + 1}.Wq": Wq, f"layer{i + 1}.Wk": Wk, f"layer{i + 1}.Wv": Wv,
                        f"layer{i + 1}.Wo": block.self_attn.out_proj.weight.detach(),
                        f"layer{i + 1}.W1": block.linear1.weight.detach(),
                        f"layer{i + 1}.W2": block.linear2.weight.detach()})
        out["readout"] = self.readout.weight.detach()
        return out


def build_model(model, vocab, n, classes, dim=64, layers=1, gates=8, heads=4, kernel_features=None,
                sigma=None, seed=0, dtype=torch.float32):
    """A deep network by name: ``"convex"`` (:class:`DeepConvexNetwork`) or ``"standard"``."""
    if model == "convex":
        return DeepConvexNetwork(vocab, n, classes, dim, layers, gates, kernel_features, sigma, seed, dtype)
    if model == "standard":
        if kernel_features is not None:
            raise invalid("kernel_features", "None for the standard transformer", repr(kernel_features),
                          "kernel preconditioning applies to the convex model")
        return StandardTransformer(vocab, n, classes, dim, layers, heads, seed, dtype)
    raise invalid("model", f"one of {MODELS}", repr(model))
