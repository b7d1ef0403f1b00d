"""The models that :func:`cvxtransformer.compare` trains against the convex optimum: one row of
:data:`MODELS` each.

A row says which network the model is (its equation), the programs of a comparison it can join,
the convex problem whose certificate bounds it (None where no convex program does: softmax
attention (3)), how to build the network, and its default head counts. A new model is one new
row here; the comparison, its report, its plots and the ``compare`` command then take it.

Example
-------
>>> import numpy as np, cvxtransformer as ct
>>> X = np.random.default_rng(0).standard_normal((20, 3, 2))
>>> P = ct.make_problem(X, X[:, 0, :], program=10, beta=0.5)
>>> [MODELS[m].bounding(P, 2, 0).program.label for m in ("alternative", "gated")]
['program (10)', 'program (12)']
>>> MODELS["softmax"].bounding is None, MODELS["gated"].equation
(True, '(11)')
"""
import importlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Optional

from ..core.errors import invalid

from ..core.attention import WeightDecayProgram

WEIGHT_DECAY = WeightDecayProgram.names  # the program with ordinary weight decay of each map: {10: ..., 12: ...}
ATTENTION_PROGRAMS = (8, 10, 12) + tuple(WEIGHT_DECAY.values())


def attention_problem(problem, number, gates=8, gate_seed=0, weight_decay=False):
    """Program ``number`` (8, 10 or 12; with ``weight_decay`` its form with ordinary weight decay, a nuclear
    norm per token) on the data, loss and encoded targets of ``problem`` (a problem of one of these
    programs), at its beta; ``problem`` itself if it is that program.

    Program (12) takes the gates of ``problem`` when it has some, else ``gates``: a count h (the
    vectors are sampled from ``gate_seed`` as :func:`cvxtransformer.make_problem` samples them), a
    pair ``(U1, U2)`` of shapes (h, n) and (h, d), or the gate options of ``make_problem`` by name
    (the count ``gates`` and gate arrays, e.g. those a DATA file holds: the command line's).
    """
    from ..core.problem import ConvexProblem
    from ..core.attention import AttentionProgram
    from ..core.validation import check_gates_memory, check_int

    program = problem.program
    if program.name == (WEIGHT_DECAY[number] if weight_decay else number):
        return problem
    if isinstance(gates, dict):
        gates = (gates.get("U1"), gates.get("U2")) if "U1" in gates or "U2" in gates else gates.get("gates", 8)
    kind, name = (WeightDecayProgram, WEIGHT_DECAY[number]) if weight_decay else (AttentionProgram, number)
    if number != 12:
        other = kind(number, program.X, program.n_outputs)
    elif getattr(program, "U1", None) is not None:
        other = kind(12, program.X, program.n_outputs, program.U1, program.U2)
    elif isinstance(gates, tuple):
        if len(gates) != 2:
            raise invalid("gates", "a count h, or a pair (U1, U2)", f"a tuple of {len(gates)}")
        other = kind.build(name, program.X, None, problem.T, U1=gates[0], U2=gates[1])  # checked there
    else:  # sampled as make_problem samples them, the memory they take checked first
        gates = check_int("gates", gates, 1)
        check_gates_memory(gates, kind.gate_bytes(program.X, None, problem.T))
        other = kind.build(name, program.X, None, problem.T, gates=gates, gate_seed=gate_seed)
    return ConvexProblem(other, problem.loss, problem.T, other.regularizer_class(problem.beta))


def _program_10(problem, gates, gate_seed):
    """Network (9) is bounded by program (10), or by (8) in a comparison on program (8)."""
    return attention_problem(problem, 8 if problem.program.name == 8 else 10)


def _program_12(problem, gates, gate_seed):
    """Network (11) is bounded by program (12) on the same gates."""
    return attention_problem(problem, 12, gates, gate_seed)


def _program_10wd(problem, gates, gate_seed):
    """Network (9w) is bounded by program (10) with ordinary weight decay."""
    return attention_problem(problem, 10, weight_decay=True)


def _program_12wd(problem, gates, gate_seed):
    """Network (11w) is bounded by program (12) with ordinary weight decay, on the same gates."""
    return attention_problem(problem, 12, gates, gate_seed, weight_decay=True)


def _itself(problem, gates, gate_seed):
    return problem


def _groups(problem, solution):
    """Enough heads for any solution of the bounding program: one per group (Proposition 1)."""
    return [problem.program.n_blocks]


def _support(problem, solution):
    """As many heads as the optimum needs: its support (Proposition 1's nonzero groups, or the ranks of the
    token matrices summed), at least one."""
    return [max(1, solution.certificate.support_size)]


def _around_rank(problem, solution):
    """For the networks of a nuclear-norm program: below, at and above rank(Z*) (summed over the gates), the
    number of heads the optimum needs."""
    r = solution.certificate.support_size
    return sorted({max(1, r - 1), max(1, r), max(1, 2 * r)})


def _attention(cls, problem, heads, sequence, seed):
    """Network (9), (11) or their weight-decay forms: the class ``cls`` of :mod:`cvxtransformer.nn.networks`,
    on the program's gates for a gated one."""
    from ..nn import networks

    p = problem.program
    gates = (p.U1, p.U2) if cls.startswith("Gated") else ()
    return getattr(networks, cls)(p.n, p.d, p.n_outputs, heads, *gates, seed=seed)


def _softmax(problem, heads, sequence, seed):
    from ..nn.networks import SoftmaxAttention

    N, n, d = problem.program.X.shape
    return SoftmaxAttention(n, d, problem.T.shape[1], sequence=sequence, seed=seed)


class GatedHeads(int):
    """A head count that carries each head's gate (``gate``, ints (m,)), for the gated MHSA network."""

    def __new__(cls, gate):
        count = super().__new__(cls, len(gate))
        count.gate = gate
        return count


def _per_gate_ranks(problem, solution):
    """For a network on fixed gates: below, at and above ``sum_g rank(Z*_g)`` heads, placed on the gates
    that need them: ``rank(Z*_g)`` heads on gate g (at), one fewer on the gate that needs the most
    (below), twice as many (above). Head counts given by the user are placed round robin instead."""
    import numpy as np

    ranks = problem.regularizer.ranks(solution.Z)
    if ranks.sum() == 0:
        return [1]
    fewer = ranks - (np.arange(len(ranks)) == np.argmax(ranks))
    counts = ([fewer] if fewer.sum() else []) + [ranks, 2 * ranks]
    return [GatedHeads(np.repeat(np.arange(len(ranks)), c)) for c in counts]


def _convex(problem, heads, sequence, seed):
    from ..nn.convex import ConvexAttention

    return ConvexAttention(problem.program)


@dataclass(frozen=True)
class Model:
    """One model of the comparison.

    Attributes
    ----------
    equation : the network's equation, e.g. ``"(9)"``; None for ``convex``, which is the program itself
    programs : the programs (``problem.program.name``) of a comparison that the model can join
    bounding : callable(problem, gates, gate_seed) -> the :class:`ConvexProblem` whose certificate D(V)
        bounds the model's objective from below, at ``problem``'s beta; None: no convex program bounds
        it, and it is compared with ``problem``'s optimum instead
    build : callable(problem, heads, sequence, seed) -> the network (a torch module of
        :mod:`cvxtransformer.nn`), on the bounding problem (or on the comparison's problem)
    default_heads : callable(problem, solution) -> head counts when none are given (``problem``, its
        certified ``solution``); None: the model has no head count (one run)
    note : for a model no program bounds, what its comparison with the optimum means (None: the
        default note of softmax attention, whose regulariser is not the convex one)
    colour : its colour in the plots (matplotlib's; None: the default cycle)
    """

    equation: Optional[str]
    programs: tuple
    bounding: Optional[Callable]
    build: Callable
    default_heads: Optional[Callable] = None
    note: Optional[str] = None
    colour: Optional[str] = None


def _imported(path, *args):
    """Call the function ``"module:name"`` (a family's network builder, imported when first used)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)(*args)


HEAD_RULES = {"groups": _groups, "support": _support, "around_rank": _around_rank, "per_gate_ranks": _per_gate_ranks}

# the comparison's own models: the networks of Proposition 1 (Ergen et al.) against programs (8)/(10)/(12), and
# the same networks with ordinary weight decay (9w)/(11w) against their programs (a nuclear norm per token)
WD_PROGRAMS = (10, 12) + tuple(WEIGHT_DECAY.values())
MODELS = {
    "alternative": Model("(9)", ATTENTION_PROGRAMS, _program_10, partial(_attention, "AlternativeAttention"), _groups,
                         colour="tab:orange"),
    "gated": Model("(11)", ATTENTION_PROGRAMS, _program_12, partial(_attention, "GatedAttention"), _groups,
                   colour="tab:red"),
    "alternative_wd": Model("(9w)", WD_PROGRAMS, _program_10wd, partial(_attention, "WeightDecayAttention"), _support,
                            colour="tab:pink"),
    "gated_wd": Model("(11w)", WD_PROGRAMS, _program_12wd, partial(_attention, "GatedWeightDecayAttention"), _support,
                      colour="darkgoldenrod"),
    "softmax": Model("(3)", ATTENTION_PROGRAMS, None, _softmax, colour="tab:purple"),
    "convex": Model(None, ATTENTION_PROGRAMS, _itself, _convex, colour="tab:cyan"),
}
DEFAULT_MODELS = {8: ("alternative", "softmax"), 10: ("alternative", "softmax"), 12: ("gated", "softmax"),
                  WEIGHT_DECAY[10]: ("alternative_wd", "softmax"), WEIGHT_DECAY[12]: ("gated_wd", "softmax")}


_JOINED = set()  # the families whose models are in MODELS


def _add_family_models():
    """The models the registered families declare (their reduction's ``models``,
    :class:`~..core.reductions.Reduction`), added once per family; run at every lookup, so that a family
    registered after this module was imported (e.g. in a user's file) joins too. A family of its own on
    Proposition 1's reduction (an :class:`~..core.attention.AttentionProgram` subclass, as
    docs/examples/custom_family.py defines) joins networks (9) and (3), as program (8) does."""
    from ..core.attention import Proposition1
    from ..core.registry import families

    for name, fam in families().items():
        if name in _JOINED:
            continue
        _JOINED.add(name)
        declared = fam.reduction.models
        if not declared and issubclass(fam.reduction, Proposition1) and name not in ATTENTION_PROGRAMS:
            declared = {"alternative": {}, "softmax": {}}
            DEFAULT_MODELS.setdefault(name, ("alternative", "softmax"))
        for model, spec in declared.items():
            if not spec:  # joins a model of the comparison to this program
                MODELS[model] = replace(MODELS[model], programs=MODELS[model].programs + (name,))
                continue
            programs = (MODELS[model].programs if model in MODELS else ()) + (name,)
            MODELS[model] = Model(spec["equation"], programs, _itself if spec.get("bounded", True) else None,
                                  partial(_imported, spec["build"]), HEAD_RULES[spec["heads"]], spec.get("note"),
                                  spec.get("colour"))
        if name not in DEFAULT_MODELS:
            DEFAULT_MODELS[name] = tuple(m for m, spec in declared.items() if spec.get("default"))


_add_family_models()


def equation(model, program):
    """The equation of a model, e.g. ``(9)``; ``convex`` is the comparison's program, trained by Adam/SGD."""
    _add_family_models()
    return (MODELS[model].equation if model in MODELS else None) or f"({program})"


def default_models(program, outputs=1):
    """The models a comparison on ``program`` trains when none are named. With several outputs (``outputs``
    >= 2), on programs (10) and (12), the networks people train, with ordinary weight decay ((9w), (11w),
    bounded by the weight-decay programs); networks (9)/(11), whose penalty squares an l1 norm of each head's
    output vector, are trained when named."""
    _add_family_models()
    if outputs >= 2 and program in WEIGHT_DECAY:
        program = WEIGHT_DECAY[program]
    return DEFAULT_MODELS[program]


def check_models(models, program, tuned=False, argument="models", outputs=1):
    """The list of model names of a comparison on ``program``: ``models`` as a list or a comma-separated
    string, or None for the defaults (:func:`default_models`, for ``outputs`` outputs; with ``tuned``,
    ``convex`` is added for the programs it joins); an empty list for a family that declares no models, and
    for an empty list: the networks of :func:`~.run.compare` may be all there is."""
    _add_family_models()
    if models is None:
        models = default_models(program, outputs) + (("convex",) if tuned and "convex" in MODELS and
                                                     program in MODELS["convex"].programs else ())
    if isinstance(models, (list, tuple)) and not models:
        return []
    text = models
    if isinstance(models, str):
        models = [m.strip() for m in models.split(",") if m.strip()]
    if not isinstance(models, (list, tuple)):
        raise invalid(argument, f"a list or a comma-separated string of models from {', '.join(MODELS)}", repr(text))
    names = list(dict.fromkeys(models))
    if not names or any(not isinstance(m, str) or m not in MODELS for m in names):
        raise invalid(argument, f"a comma-separated list from {', '.join(MODELS)}", repr(text))
    wrong = [m for m in names if program not in MODELS[m].programs]
    if wrong:
        fits = [m for m in MODELS if program in MODELS[m].programs]
        raise invalid(argument, f"{' or '.join(fits)} with program ({program})" if fits else
                      f"no model: program ({program}) has none of compare's models", repr(text),
                      f"{wrong[0]} joins program{'s' if len(MODELS[wrong[0]].programs) > 1 else ''} "
                      + ", ".join(map(str, MODELS[wrong[0]].programs)))
    return names


MAX_HEADS = 10**6  # the most heads (or units) a network of the comparison is given


def check_heads(heads, argument="heads"):
    """None (each model's default) or a list of head counts >= 1, from an int, a list or ``"1,2,4"``."""
    if heads is None:
        return None
    text = heads
    try:
        if isinstance(heads, str):
            heads = [int(v) for v in heads.split(",") if v.strip()]
        elif not isinstance(heads, (list, tuple)):
            heads = [heads]
        ok = all(not isinstance(h, bool) and int(h) == h for h in heads)
        heads = [int(h) for h in heads] if ok else []
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        heads = []
    if not heads or min(heads) < 1 or max(heads) > MAX_HEADS:
        raise invalid(argument, f"an integer in [1, {MAX_HEADS}] or a comma-separated list of them", repr(text))
    return list(dict.fromkeys(heads))
