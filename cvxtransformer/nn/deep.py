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

With ``learn_gates=True`` (the rung ``convex-learned-gates`` of the ablation ladder of
docs/reproduction.md) the gate vectors are parameters: the forward pass uses the hard mask of
program (12), the backward pass the gradient of ``sigmoid(s / std(s))`` (a straight-through
estimator, ``s = u_1j^T X_i u_2j``); every forward pass is still program (12) for the current gates.

:class:`ReLUNetwork` is network (11) with ReLU gates (each neuron gated by its own sign):
``yhat_i = sum_j relu(w_1j^T X_i w_2j) w_3j`` on learned embeddings. On one-hot tokens its
activation pattern is the gate mask of program (12) with ``U1 = W1`` and ``U2 = (E W2^T)^T``
(:meth:`ReLUNetwork.gates`): the oracle gates of :mod:`cvxtransformer.experiments.gates`.

:class:`UCSDNetwork` is the UCSD report's model as far as its text describes it (their Section 3
and 5.2): convex attention blocks of program (10) (a linear map of the whole sequence, one head
per layer) each followed by an MLP, a last convex block that outputs the logits, and squared-norm
penalties; residual connections and post-norm layer normalisation as in the standard transformer
(the report does not say).

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
from ..core.attention import gate_mask, gated_outputs, sample_gates
from ..core.validation import check_choice, check_int
from .fastfood import Fastfood

MODELS = ("convex", "convex-learned-gates", "relu", "ucsd", "standard")


class ConvexLayer(torch.nn.Module):
    """The map of program (12) on a batch of sequences: (B, n, d) -> (B, c).

    Parameters
    ----------
    n, d : tokens and token dimension of the input
    c : outputs (``n_out * d_out`` for a sequence output, C for logits)
    gates : h, the number of gate vectors
    seed : seed of the gates (:func:`cvxtransformer.sample_gates`) and of the initial ``Z``
    kernel : optional :class:`Fastfood` map ``R^d -> R^D`` applied to every token first
    learn_gates : gates as parameters, trained through a straight-through estimator (module docstring)

    ``Z`` (h, c, n, D) is initialised N(0, 2 / (h n D)) so that outputs have about the scale
    of the input.
    """

    def __init__(self, n, d, c, gates, seed=0, kernel=None, learn_gates=False, dtype=torch.float32):
        super().__init__()
        self.n, self.d, self.c, self.h = n, d, c, gates
        self.kernel, self.learn_gates = kernel, learn_gates
        self.d_feat = d if kernel is None else kernel.D
        U1, U2 = (torch.as_tensor(U, dtype=dtype) for U in sample_gates(gates, n, self.d_feat, seed))
        if learn_gates:
            self.U1, self.U2 = torch.nn.Parameter(U1), torch.nn.Parameter(U2)
        else:
            self.register_buffer("U1", U1)
            self.register_buffer("U2", U2)
        rng = np.random.default_rng(seed + 7919)
        Z = rng.standard_normal((gates, c, n, self.d_feat)) * math.sqrt(2.0 / (gates * n * self.d_feat))
        self.Z = torch.nn.Parameter(torch.as_tensor(Z, dtype=dtype))

    def features(self, X):
        """The data of the program: ``phi(X)`` with a kernel, ``X`` otherwise; shape (B, n, D)."""
        return X if self.kernel is None else self.kernel.torch_forward(X)

    def mask(self, F):
        """Gate mask (B, h) of program (12) on features ``F`` (:func:`cvxtransformer.core.attention.gate_mask`);
        with learned gates, its values are the hard mask and its gradient that of ``sigmoid(s / std(s))``."""
        if not self.learn_gates:
            return gate_mask(F, self.U1, self.U2)
        s = torch.einsum("jk,ikd,jd->ij", self.U1, F, self.U2)
        soft = torch.sigmoid(s / s.detach().std().clamp_min(1e-12))
        return (s >= 0).to(F.dtype).detach() + soft - soft.detach()

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
            mask = self.mask(FE[tokens])
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
    learn_gates : train the gate vectors too (straight-through; see the module docstring)
    """

    def __init__(self, vocab, n, classes, dim=64, layers=1, gates=8, kernel_features=None, sigma=None,
                 seed=0, dtype=torch.float32, learn_gates=False):
        super().__init__()
        for name, v, low in (("vocab", vocab, 1), ("n", n, 1), ("classes", classes, 2), ("dim", dim, 1),
                             ("layers", layers, 1), ("gates", gates, 1)):
            check_int(name, v, low)
        if kernel_features is not None:
            check_int("kernel_features", kernel_features, 1)
        self.n, self.classes, self.dim, self.L = n, classes, dim, layers
        self.name = "convex-learned-gates" if learn_gates else "convex"
        gen = torch.Generator().manual_seed(seed)
        self.embedding = torch.nn.Parameter(torch.randn(vocab, dim, generator=gen, dtype=dtype))
        sigma = math.sqrt(dim) if sigma is None else sigma
        blocks = []
        for layer in range(layers):
            kernel = None if kernel_features is None else Fastfood(dim, kernel_features, sigma, seed=seed + 101 * layer)
            c = classes if layer == layers - 1 else n * dim
            blocks.append(ConvexLayer(n, dim, c, gates, seed=seed + 1000 * (layer + 1), kernel=kernel,
                                      learn_gates=learn_gates, dtype=dtype))
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


class ReLUNetwork(torch.nn.Module):
    """Network (11) with ReLU gates on learned embeddings: ``yhat_i = sum_j relu(w_1j^T X_i w_2j) w_3j``.

    ``X_i = E[tokens_i]`` (n, dim); ``W1`` (h, n) (attention rows, unconstrained), ``W2`` (h, dim),
    ``W3`` (h, C). Trained with AdamW (decoupled weight decay), like the standard transformer.
    """

    name = "relu"

    def __init__(self, vocab, n, classes, dim=64, hidden=512, seed=0, dtype=torch.float32):
        super().__init__()
        for name, v, low in (("vocab", vocab, 1), ("n", n, 1), ("classes", classes, 2), ("dim", dim, 1),
                             ("hidden", hidden, 1)):
            check_int(name, v, low)
        self.n, self.classes, self.dim, self.h = n, classes, dim, hidden
        gen = torch.Generator().manual_seed(seed)
        r = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)
        self.embedding = torch.nn.Parameter(r(vocab, dim))
        self.W1 = torch.nn.Parameter(r(hidden, n) / math.sqrt(n))
        self.W2 = torch.nn.Parameter(r(hidden, dim) / math.sqrt(dim))
        self.W3 = torch.nn.Parameter(r(hidden, classes) / math.sqrt(hidden))

    def preactivations(self, tokens):
        """``w_1j^T X_i w_2j`` (N, h), through the per-token table ``E W2^T`` (V, h)."""
        G = self.embedding @ self.W2.T
        return sum(self.W1[:, k] * G[tokens[:, k]] for k in range(self.n))

    def forward(self, tokens):
        return torch.relu(self.preactivations(tokens)) @ self.W3

    def penalty(self):
        """``1/2 sum ||W||_F^2`` over all parameters (the weight decay, applied decoupled by AdamW)."""
        return 0.5 * sum(torch.sum(p ** 2) for p in self.parameters())

    def weight_matrices(self):
        return {"embedding": self.embedding.detach(), "W2": self.W2.detach(), "W3": self.W3.detach()}

    @torch.no_grad()
    def gates(self):
        """The activation pattern as gates of program (12) on one-hot tokens (d = vocab): ``U1`` (h, n)
        and ``U2`` (h, vocab), float64 ndarrays, with ``1[U1_j^T X_i U2_j >= 0]`` the sign of neuron j."""
        return self.W1.double().numpy().copy(), (self.embedding @ self.W2.T).T.double().numpy().copy()


class UCSDNetwork(torch.nn.Module):
    """The UCSD report's model (see the module docstring): embeddings, then L blocks
    ``X = LN(X + A_l(X)); X = LN(X + MLP_l(X))`` and the logits ``<Z_out[c], X>``.

    ``A_l`` is program (10) with one target per output token (``Z_l`` of shape (n dim, n, dim), a
    linear map of the flattened sequence), the MLP has width ``hidden`` (default 4 dim) and the
    readout is program (10) with C outputs. :meth:`penalty` is their ``sum ||p||^2`` over every
    parameter but the embeddings (the runner divides it by the batch size, as they do).
    """

    name = "ucsd"

    def __init__(self, vocab, n, classes, dim=64, layers=1, hidden=None, seed=0, dtype=torch.float32):
        super().__init__()
        hidden = 4 * dim if hidden is None else hidden
        for name, v, low in (("vocab", vocab, 1), ("n", n, 1), ("classes", classes, 2), ("dim", dim, 1),
                             ("layers", layers, 1), ("hidden", hidden, 1)):
            check_int(name, v, low)
        self.n, self.classes, self.dim, self.L = n, classes, dim, layers
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, global RNG untouched
            torch.manual_seed(seed)
            self.embedding = torch.nn.Parameter(torch.randn(vocab, dim, dtype=dtype))
            lin = lambda a, b, bias=True: torch.nn.Linear(a, b, bias=bias, dtype=dtype)
            self.attention = torch.nn.ModuleList([lin(n * dim, n * dim, False) for _ in range(layers)])
            self.mlp = torch.nn.ModuleList([torch.nn.Sequential(lin(dim, hidden), torch.nn.ReLU(), lin(hidden, dim))
                                            for _ in range(layers)])
            self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(dim, dtype=dtype) for _ in range(2 * layers)])
            self.readout = lin(n * dim, classes, False)

    def forward(self, tokens):
        X = self.embedding[tokens]
        B = X.shape[0]
        for layer in range(self.L):
            X = self.norms[2 * layer](X + self.attention[layer](X.reshape(B, -1)).reshape(X.shape))
            X = self.norms[2 * layer + 1](X + self.mlp[layer](X))
        return self.readout(X.reshape(B, -1))

    def penalty(self):
        """``sum ||p||^2`` over the convex blocks and the MLPs (every parameter but the embeddings)."""
        return sum(torch.sum(p ** 2) for name, p in self.named_parameters() if name != "embedding")

    def weight_matrices(self):
        out = {}
        for i in range(self.L):
            out.update({f"layer{i + 1}.Z": self.attention[i].weight.detach(),
                        f"layer{i + 1}.W1": self.mlp[i][0].weight.detach(),
                        f"layer{i + 1}.W2": self.mlp[i][2].weight.detach()})
        out["readout.Z"] = self.readout.weight.detach()
        return out


def build_model(model, vocab, n, classes, dim=64, layers=1, gates=8, heads=4, kernel_features=None,
                sigma=None, seed=0, dtype=torch.float32, hidden=None):
    """A deep network by name (:data:`MODELS`): ``"convex"`` and ``"convex-learned-gates"``
    (:class:`DeepConvexNetwork`), ``"relu"`` (:class:`ReLUNetwork`, ``hidden`` neurons, default 512;
    one hidden layer, ``layers`` must be 1), ``"ucsd"`` (:class:`UCSDNetwork`, MLP width ``hidden``)
    or ``"standard"`` (:class:`StandardTransformer`)."""
    check_choice("model", model, MODELS)
    if model in ("convex", "convex-learned-gates"):
        return DeepConvexNetwork(vocab, n, classes, dim, layers, gates, kernel_features, sigma, seed, dtype,
                                 learn_gates=model == "convex-learned-gates")
    if kernel_features is not None:
        raise invalid("kernel_features", f"None for --model {model}", repr(kernel_features),
                      "kernel preconditioning applies to the convex model")
    if model == "relu":
        if layers != 1:
            raise invalid("layers", "1 for the relu model (network (11): one hidden layer)", repr(layers))
        return ReLUNetwork(vocab, n, classes, dim, 512 if hidden is None else hidden, seed, dtype)
    if model == "ucsd":
        return UCSDNetwork(vocab, n, classes, dim, layers, hidden, seed, dtype)
    return StandardTransformer(vocab, n, classes, dim, layers, heads, seed, dtype)
