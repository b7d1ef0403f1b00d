"""Working sets and screening of the torch backend, one strategy per regulariser.

* :class:`BlockWorkingSet` (group lasso): blocks are (gate j, token k) pairs; gap-safe screening
  discards groups proved zero; the working set holds the support and the worst KKT violators and
  grows until no block outside it violates the KKT conditions; subproblems restrict the operator
  to gates J and tokens K.
* :class:`WholeProblem` (any regulariser): every iteration works on the whole problem; gap-safe
  screening marks the blocks proved zero (for the nuclear norm, a proved bound on the rank of every
  optimum, reported).
* :class:`TokenWorkingSet` (a nuclear norm per token): the blocks of :class:`BlockWorkingSet`, scored by
  spectral norms, screened by the rank test of each token's matrix.
* :class:`GateWorkingSet` (nuclear norm): working sets of gates of a stack ``(P, p, q)`` of matrices
  (the gated MHSA program); gates proved zero are dropped, a gate enters when its dual norm
  ``||(A^T V)_g||_2`` exceeds beta, and subproblems restrict the operator to the gates of the set.
  A single matrix (program (6)) is one gate: the whole problem.

Each offers ``screen``, ``next`` (the next working
set, as a hashable key: None for the whole problem), ``restrict``, ``extract``, ``embed`` and
``screened_mask``; those whose ``restricts_forward`` is set, ``forward`` (``A x`` for a certificate
check, cheaper than the operator's own).
"""
import weakref

import numpy as np
import torch

from cvxtransformer.core.arrays import F64
from cvxtransformer.core.regularizers import GroupLasso, NuclearNorm, TokenNuclearNorm

_BLOCK_NORMS = weakref.WeakKeyDictionary()  # program -> (h, n) tensor of exact ||A_g||, shared along a path
# Multiply-adds of a Gram matrix of every violating block (N F^2) up to which the first working set takes them all:
# a second round (a check, the new columns, FISTA restarted) costs a few ms of Python-level torch calls, more than
# such a Gram matrix ((8) squared, N=1,000, n=8, d=16: 3 tokens then 8, 11 ms of CPU; 8 at once, see the benchmark)
ONE_ROUND = 3e7
# Later rounds take only the violators above the pivot's drop where it divides the scores by STANDOUT or more
# (else as many as the set holds): (8) squared, N=50,000, n=8, d=16, rho=0.8, 0.05 beta_max held 2 tokens, and the
# third, at 3.6 against 1.4 for the five others, came with all of them (a 128-feature Gram matrix, 74 ms a solve).
# A first set within ONE_ROUND takes them alone too (a group lasso with the squared loss: one Newton polish solves a
# small set to tol, the driver's SMALL_SUPPORT rule): (8) squared, N=1,000, n=8, d=16, rho=0, 0.1 beta_max, six
# seeds, 3 tokens at 4.4 to 10 against 2.7 or less: 2.27-2.47 -> 1.91-1.94 ms of CPU (a Gram matrix and a polish of
# 48 features, not 128); at rho=0.8 none stands out (10 against 9.8 or more), and every token is taken as before
STANDOUT = 2.0


def first_size(scores, cap):
    """Blocks the first working set takes, given the KKT scores of the unscreened blocks (> 1: a violator;
    the caller takes no more than the violators): those above the largest relative drop among the best
    ``cap + 1`` scores (a pivot rule like adelie's, arXiv 2405.08631; scored among every unscreened block, not
    the violators alone, so that three planted tokens far above the rest are taken together):
    the few blocks that stand out, not ``cap`` of them, where few stand out (the Gram matrix of the set
    costs the square of its size; a set that grows sums only its new columns, and the padding of a quarter
    more blocks this rule had cost more than it saved on the planted instances of the benchmark: (8) squared,
    N=20,000, n=8, d=16, 3 true tokens, a 64-feature Gram matrix 8.2 ms of a 19.5 ms solve)."""
    top = -np.sort(-np.asarray(scores))[:cap + 1]  # the best cap + 1, descending
    k = int(np.argmax(top[:-1] / top[1:])) + 1 if len(top) > 2 else len(scores)
    return min(cap, len(scores), k)


class BlockWorkingSet:
    """Working sets of (gate, token) blocks for the group lasso (programs (8), (10), (12)).

    ``norms``: "exact" computes ``||A_g||`` for every group once per program (cached, e.g. along a
    path); "auto" uses them when cached and the bound ``||A_g||_F`` otherwise.
    """

    polishable = True
    restricts_forward = False  # A x: the operator reads the gates and tokens where x is nonzero only

    def __init__(self, problem, op, norms="auto"):
        self.problem, self.op, self.norms = problem, op, norms
        self.h, self.c, self.n, self.d = problem.program.canonical_shape
        self.screened = torch.zeros(self.h, self.c, self.n, dtype=torch.bool, device=op.device)
        self.ws, self._bound = None, None

    def norms_known(self):
        """Whether exact operator norms are used (asked for, or cached for this program)."""
        return self.norms == "exact" or self.problem.program in _BLOCK_NORMS

    def block_norms(self):
        program = self.problem.program
        if program not in _BLOCK_NORMS and self.norms == "exact":
            _BLOCK_NORMS[program] = self.op.block_norms().cpu()
        if program in _BLOCK_NORMS:
            return _BLOCK_NORMS[program].to(self.op.device)
        if self._bound is None:
            self._bound = self.op.block_norm_bounds()
        return self._bound

    def screen(self, G_best, radius):
        """Gap-safe test at the best dual point; returns the number of groups screened so far."""
        self.screened |= self.problem.regularizer.screen(G_best, radius, self.block_norms()[:, None, :])
        return int(self.screened.sum())

    def blocks_open(self):
        """The (gate j, token k) blocks not proved zero, boolean (h, n)."""
        return ~self.screened.all(dim=1)

    def scores(self, G):
        """KKT scores of the blocks (h, n): ``max_l ||G_{j,l,k}|| / beta`` (> 1: a violation)."""
        return torch.amax(torch.linalg.vector_norm(G, dim=-1), dim=1) / self.problem.beta

    def next(self, chk, x, enabled, p0):
        """The next working set ``(J, K)``, whether it is settled, and its number of groups.

        The working set only grows: it keeps its blocks (gate j, token k) and adds the worst KKT
        violators outside it (``max_l ||(A^T V)_{j,l,k}|| > beta``), at most as many as it holds
        (at least ``p0``). The first one (nothing held) takes, for each output, the tokens whose best
        score over the gates stands out (:func:`first_size`, at most ``p0``), each with its violating
        gates (on gated programs every gate of a token is about as likely as any other, and the outputs
        of program (10) share the Gram matrix of the set but have tokens of their own); every violating
        token where that is three quarters of them or more, or where their Gram matrix costs at most
        ``ONE_ROUND`` multiply-adds (there, for the squared loss, the few that stand out clearly, by
        ``STANDOUT``, where some do). It is *settled* when no block outside it violates the KKT
        conditions (or it holds every unscreened block): its solution is then the full solution.
        """
        # the bookkeeping of (h, n) blocks runs on the host in numpy: a few dozen operations on arrays of h n entries
        # (a working set of 8 tokens: 0.2 ms as torch calls)
        blocks_open = self.blocks_open().cpu().numpy()
        if self.ws is None:
            self.ws = np.zeros_like(blocks_open)
        self.ws |= (torch.linalg.vector_norm(x, dim=-1) > 0).any(dim=1).cpu().numpy()
        score = self.scores(chk.G).cpu().numpy()
        candidates = blocks_open & ~self.ws & (score > 1.0)
        n_cand = int(candidates.sum())
        if n_cand and enabled and not self.ws.any():  # the first set: tokens that stand out, every violating gate
            open_tokens = candidates.any(axis=0)
            every = int(open_tokens.sum())
            chosen = open_tokens.copy()
            if self.op.N_total * (self.h * every * self.d) ** 2 > ONE_ROUND:  # else all of them at once (every shard)
                chosen[:] = False
                norms = torch.linalg.vector_norm(chk.G, dim=-1)
                per_output = (torch.amax(norms, dim=0) / self.problem.beta).cpu().numpy()
                unscreened = blocks_open.any(axis=0)
                for token in per_output:  # each output's own tokens that stand out among its unscreened ones (c, n)
                    violating = np.where(open_tokens & (token > 1.0), token, -np.inf)
                    take = min(first_size(token[unscreened], p0), int(np.isfinite(violating).sum()))
                    chosen[np.argsort(-violating, kind="stable")[:take]] = True
                if 4 * int(chosen.sum()) >= 3 * every:  # most of them: all, rather than a second round for the rest
                    chosen = open_tokens
            elif self.polishable and self.problem.loss.quadratic and every > 2:  # small: all, unless a few stand out
                token = score.max(axis=0)  # each token's best score over the gates
                top = -np.sort(-token[blocks_open.any(axis=0)])
                k = first_size(top, p0)
                if k < min(every, len(top)) and top[k - 1] >= STANDOUT * top[k]:
                    chosen[:] = False
                    chosen[np.argsort(-np.where(open_tokens, token, -np.inf), kind="stable")[:k]] = True
            self.ws[:, chosen] = candidates[:, chosen]
        elif n_cand:
            held = int(self.ws.sum())
            take = n_cand if not enabled else min(n_cand, max(p0, held))
            if enabled and n_cand > 1:  # a few violators that stand out clearly: those alone (a smaller Gram matrix)
                k = first_size(score[candidates], take)
                top = -np.sort(-score[candidates])[:k + 1]
                if k < len(top) and top[k - 1] >= STANDOUT * top[k]:
                    take = k
            self.ws.flat[np.argsort(-np.where(candidates, score, -np.inf).ravel(), kind="stable")[:take]] = True
        if not self.ws.any():  # nothing violates at x: keep the best-scored open block
            self.ws.flat[int(np.argmax(np.where(blocks_open, score, -np.inf)))] = True
        J, K = np.flatnonzero(self.ws.any(axis=1)), np.flatnonzero(self.ws.any(axis=0))
        self.ws[J[:, None], K] = True
        settled = n_cand == 0 or bool((self.ws | ~blocks_open).all())
        device = self.op.device
        return (torch.from_numpy(J).to(device), torch.from_numpy(K).to(device)), settled, len(J) * len(K) * self.c

    @staticmethod
    def restrict(op, key):
        J, K = key
        return op.restrict(J, K)

    @staticmethod
    def extract(x, key):
        J, K = key
        return x.index_select(0, J).index_select(2, K)

    def embed(self, block, key):
        J, K = key
        blockJ = torch.zeros(self.h, self.c, len(K), self.d, dtype=block.dtype, device=block.device)
        blockJ.index_copy_(0, J, block)
        return torch.zeros(self.h, self.c, self.n, self.d, dtype=block.dtype,
                           device=block.device).index_copy_(2, K, blockJ)

    def screened_mask(self):
        """The groups proved zero, boolean, in the shape of the program's groups."""
        return self.screened.cpu().numpy().reshape(self.problem.program.shape[:-1])


class WholeProblem:
    """No working set: every iteration works on the whole problem, and the path is made cheap by warm
    starts. Gap-safe screening marks the blocks proved zero at every optimum (for the nuclear norm the
    unscreened singular directions are a proved bound on the rank), reported with the solution."""

    polishable = False
    restricts_forward = False

    def __init__(self, problem, op, norms="auto"):
        self.problem, self.op = problem, op
        self.mask = np.zeros(problem.program.n_blocks, dtype=bool)

    def norms_known(self):
        return True

    def forward(self, x):
        return self.op.forward(x)

    def screen(self, G_best, radius):
        p = self.problem
        shape = p.program.canonical_shape
        found = p.regularizer.screen(G_best.cpu().numpy().reshape(shape), radius, p.program.block_norms())
        self.mask |= np.asarray(found).reshape(self.mask.shape)
        return int(self.mask.sum())  # each test holds at every optimum: keep every block proved inactive

    def next(self, chk, x, enabled, p0):
        return None, True, int(np.prod(x.shape))

    @staticmethod
    def restrict(op, key):
        return op

    @staticmethod
    def extract(x, key):
        return x

    @staticmethod
    def embed(block, key):
        return block

    def screened_mask(self):
        return self.mask.copy()


class GateWorkingSet(WholeProblem):
    """Working sets of gates for a nuclear norm summed over a stack ``(P, p, q)`` of matrices.

    Only gates that can be nonzero are touched: a gate whose singular directions are all proved
    inactive by screening is dropped (its coefficients are zero at every optimum), and a gate enters
    the set when it is nonzero or its dual norm ``||(A^T V)_g||_2`` exceeds beta (the worst violators
    first, at most doubling the set, as :class:`BlockWorkingSet`; the first set holds the gates of
    ``p0`` singular directions). Each subproblem restricts the
    operator to the gates of the set (``op.restrict(J)``). A single matrix (program (6)) is one gate,
    always in the set: the whole problem. Within a gate, no working set of row and column subspaces:
    it was tried on program (6) and never paid (the map costs O(N d^3 c) either way, the SVD of the
    prox is cheap beside it).
    """

    restricts_forward = True  # forward: the gates where x is nonzero only

    def __init__(self, problem, op, norms="auto"):
        super().__init__(problem, op, norms)
        shape = problem.program.canonical_shape
        self.gates = shape[0] if len(shape) == 3 else 1
        self.mask = self.mask.reshape(self.gates, -1)  # singular directions proved inactive, per gate
        self.ws = None

    def forward(self, x):
        """``A x`` from the gates where ``x`` is nonzero only."""
        if self.gates == 1:
            return self.op.forward(x)
        J = torch.nonzero(torch.linalg.matrix_norm(x) > 0).flatten()
        if len(J) == 0:
            return torch.zeros(self.op.N, self.problem.program.n_outputs, dtype=F64, device=self.op.device)
        return self.op.forward(x) if len(J) > 0.5 * self.gates else self.op.restrict(J).forward(x.index_select(0, J))

    def next(self, chk, x, enabled, p0):
        """The next working set (``(J,)``, J a tensor of gates; None: every gate), whether it is settled (no gate
        outside it violates its dual constraint), and its number of coefficients."""
        if self.gates == 1:
            return None, True, int(np.prod(x.shape))
        open_ = torch.from_numpy(~self.mask.all(axis=1)).to(x.device)
        if self.ws is None:
            self.ws = torch.zeros(self.gates, dtype=torch.bool, device=x.device)
        self.ws = (self.ws | (torch.linalg.matrix_norm(x) > 0)) & open_
        score = torch.linalg.matrix_norm(chk.G, ord=2) / self.problem.beta
        candidates = open_ & ~self.ws & (score > 1.0)
        n_cand = int(candidates.sum())
        if n_cand:
            first = -(-p0 // self.mask.shape[1])  # p0 blocks (singular directions): whole gates
            take = n_cand if not enabled else min(n_cand, max(first, int(self.ws.sum())))
            self.ws[torch.topk(torch.where(candidates, score, -np.inf), take).indices] = True
        if not self.ws.any() and open_.any():  # nothing violates at x: keep the best-scored open gate
            self.ws[int(torch.argmax(torch.where(open_, score, -np.inf)))] = True
        settled = n_cand == 0 or bool((self.ws | ~open_).all())
        J = torch.nonzero(self.ws).flatten()
        return (J,), settled, len(J) * int(np.prod(x.shape[1:]))

    @staticmethod
    def restrict(op, key):
        return op if key is None else op.restrict(key[0])

    @staticmethod
    def extract(x, key):
        return x if key is None else x.index_select(0, key[0])

    def embed(self, block, key):
        if key is None:
            return block
        return torch.zeros((self.gates,) + tuple(block.shape[1:]), dtype=block.dtype,
                           device=block.device).index_copy_(0, key[0], block)

    def screened_mask(self):
        """Singular directions proved inactive: one row per gate (P, min(p, q)), or (min(p, q),) for one matrix."""
        return self.mask.reshape(self.problem.program.shape[:-2] + (-1,)).copy()


class TokenWorkingSet(BlockWorkingSet):
    """Working sets of (gate j, token k) blocks for a nuclear norm of each token's ``c x d`` matrix (the
    weight-decay programs): the blocks, operators and subproblems of :class:`BlockWorkingSet`; a block's KKT
    score is the spectral norm of its ``c x d`` block of ``A^T V`` over beta, and gap-safe screening proves
    singular directions of each token's matrix inactive (a rank bound; a block whose directions are all
    inactive is zero at every optimum). No Newton polish (it is the group lasso's)."""

    polishable = False

    def __init__(self, problem, op, norms="auto"):
        super().__init__(problem, op, norms)
        self.directions = torch.zeros(self.h, self.n, min(self.c, self.d), dtype=torch.bool, device=op.device)

    def blocks_open(self):
        return ~self.directions.all(dim=-1)

    def scores(self, G):
        return self.problem.regularizer.spectral_norms(G) / self.problem.beta

    def screen(self, G_best, radius):
        """Gap-safe rank test at the best dual point; returns the number of singular directions screened."""
        found = self.problem.regularizer.screen(G_best.cpu().numpy(), radius, self.block_norms().cpu().numpy())
        self.directions |= torch.from_numpy(found).to(self.directions.device)
        return int(self.directions.sum())

    def screened_mask(self):
        """Singular directions proved inactive, per token matrix (``shape[:-3] + (n, min(c, d))``)."""
        p = self.problem.program
        return self.directions.cpu().numpy().reshape(p.shape[:-3] + self.directions.shape[1:])


STRATEGIES = {GroupLasso: BlockWorkingSet, NuclearNorm: GateWorkingSet, TokenNuclearNorm: TokenWorkingSet}


def working_set_for(problem, op, norms):
    """The working-set strategy of the problem's regulariser."""
    return STRATEGIES[type(problem.regularizer)](problem, op, norms)
