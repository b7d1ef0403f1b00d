"""The contract (core/contracts.py): a family, a loss or a solver that lacks a face is refused when it
is registered, with one error naming the face and who needs it; a loss without a Hessian is refused
by the torch backend's proximal Newton up front (and solved first-order with method="data"); the
built-in families, losses and solvers offer every face; program (8)'s rules live in its class."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer import solvers
from cvxtransformer.core import contracts, registry
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.core.losses import LOSSES, LogisticLoss, register_loss
from cvxtransformer.core.attention import AttentionProgram, Proposition1
from cvxtransformer.core.regularizers import GroupLasso


def test_the_built_in_families_losses_and_solvers_offer_every_face():
    for fam in registry.families().values():
        assert contracts.missing_faces(fam.program, contracts.PROGRAM_FACES) == []
        assert contracts.missing_faces(fam.program.regularizer_class, contracts.REGULARIZER_FACES) == []
        assert contracts.missing_faces(fam.reduction, contracts.REDUCTION_FACES) == []
    assert sorted(LOSSES) == ["cross_entropy", "logistic", "squared"]
    for loss in LOSSES.values():
        assert contracts.missing_faces(loss, {**contracts.LOSS_FACES, **contracts.NEWTON_FACES}) == []
    assert sorted(solvers.SOLVERS) == ["clarabel", "fista", "scs"]
    for solver in solvers.SOLVERS.values():
        assert contracts.missing_faces(solver, contracts.SOLVER_FACES) == []
    assert solvers.SOLVERS["fista"].requires is contracts.TORCH_BACKEND  # one table, not a copy
    assert solvers.SOLVERS["clarabel"].requires is contracts.CVXPY_BUILDERS


@pytest.mark.parametrize("role, make, face, consumer", [
    ("program", lambda: (type("NoNorms", (AttentionProgram,), {"block_norms": None}), Proposition1),
     "block_norms", "the torch backend needs block_norms"),
    ("program", lambda: (type("NoCVXPY", (AttentionProgram,), {"cvxpy_forward": None, "from_blocks": None}),
                         Proposition1),
     "cvxpy_forward, from_blocks", "the CVXPY builders needs cvxpy_forward, from_blocks"),
    ("regularizer", lambda: (type("NoProx", (AttentionProgram,),
                                  {"regularizer_class": type("NoProxLasso", (GroupLasso,), {"prox": None})}),
                             Proposition1),
     "prox", "the torch backend needs prox"),
    ("reduction", lambda: (AttentionProgram, type("NoInvert", (Proposition1,), {"invert": None})),
     "invert", "recover_weights, nonconvex_objective and certify_network needs invert"),
])
def test_a_family_with_a_missing_face_is_refused_at_registration(role, make, face, consumer):
    program, reduction = make()
    before = dict(registry.families())
    with pytest.raises(InvalidInputError) as info:
        registry.register("toy", program, reduction, ("squared",))
    message = str(info.value)
    assert message.startswith(f"register: {role} of family 'toy': ")
    assert f"lacks {face} (" in message and consumer in message
    assert registry.families() == before  # nothing registered
    with pytest.raises(InvalidInputError, match="program"):
        ct.make_problem(np.ones((4, 2, 2)), np.ones(4), program="toy", beta=1.0)


def test_a_complete_family_registers_and_solves_under_its_own_name(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    registry.register("toy", type("Toy", (AttentionProgram,), {}), Proposition1, ("squared",))
    X = np.random.default_rng(0).standard_normal((20, 3, 2))
    P = ct.make_problem(X, X[:, 0, :1], program="toy", beta=0.3)
    Q = ct.make_problem(X, X[:, 0, :1], program=10, beta=0.3)
    assert type(P.program).__name__ == "Toy" and P.beta_max() == pytest.approx(Q.beta_max(), rel=1e-12)


def test_a_loss_with_a_missing_face_is_refused_at_registration():
    with pytest.raises(InvalidInputError, match=r"^register_loss: loss 'broken': \w+ lacks dual_objective "
                                                r"\(the verifier and the certificates needs dual_objective; "
                                                r"the torch backend needs dual_objective\)"):
        register_loss(type("Broken", (LogisticLoss,), {"name": "broken", "dual_objective": None}))
    assert "broken" not in LOSSES


def test_a_solver_with_a_missing_face_is_refused_at_registration():
    class Nameless(solvers.Solver):
        def solve(self, problem, form="primal", tol=1e-6, verbose=False, **options):
            return None

    with pytest.raises(InvalidInputError, match=r"register: solver None: Nameless lacks name "):
        solvers.register(Nameless)
    with pytest.raises(InvalidInputError, match=r"lacks solve \(cvxtransformer.solve needs solve\)"):
        solvers.register(type("Idle", (solvers.Solver,), {"name": "idle"}))
    assert None not in solvers.SOLVERS and "idle" not in solvers.SOLVERS


def test_a_loss_without_a_hessian_is_refused_by_proximal_newton_up_front():
    NoHessian = type("NoHessian", (LogisticLoss,), {"hessian": None, "gradient_metric": None})
    rng = np.random.default_rng(1)
    X = rng.standard_normal((40, 3, 2))
    y = np.where(X[:, 0, 0] + 0.3 * rng.standard_normal(40) > 0, 1, -1)
    P = ct.make_problem(X, y, program=10, loss=NoHessian(), beta=1.0)
    P = P.with_beta(0.2 * P.beta_max())
    with pytest.raises(InvalidInputError, match=r"^solver: 'fista' cannot solve program \(10\) with NoHessian: "
                                                r"it needs loss.hessian; pass method=\"data\""):
        ct.solve(P, "fista")
    first_order = ct.solve(P, "fista", method="data", tol=1e-7)
    reference = ct.solve(ct.make_problem(X, y, program=10, loss="logistic", beta=P.beta), "clarabel", tol=1e-7)
    assert first_order.certified and first_order.certificate.relative_gap <= 1e-7
    assert first_order.certificate.primal_objective == pytest.approx(reference.certificate.primal_objective,
                                                                     rel=1e-6)


def test_program_8_rules_are_its_classs():
    X = np.random.default_rng(2).standard_normal((30, 3, 2))
    with pytest.raises(InvalidInputError, match=r"^y: expected shape \(N,\) for program \(8\)"):
        ct.make_problem(X, X[:, 0, :2], program=8, beta=1.0)
    AttentionProgram.check_targets(10, X[:, 0, :2])  # (10) takes vector targets
    P8 = ct.make_problem(X, X[:, 0, 0], program=8, beta=0.3)
    P10 = ct.make_problem(X, X[:, 0, :1], program=10, beta=0.3)
    assert P8.program.scalar_output and not P10.program.scalar_output
    r8, r10 = ct.solve(P8, "fista"), ct.solve(P10, "fista")
    assert r8.V.shape == (30,) and r10.V.shape == (30, 1)
    np.testing.assert_allclose(r8.V, r10.V[:, 0], rtol=1e-5, atol=1e-8)  # the same program, one output


def test_generic_code_reads_the_family():
    labels = {name: (f.label, f.gate_arrays, f.program.support_label) for name, f in registry.families().items()}
    assert labels == {8: ("program (8)", (), "nonzero groups"), 10: ("program (10)", (), "nonzero groups"),
                      12: ("program (12)", ("U1", "U2"), "nonzero groups"),
                      "10wd": ("program (10wd)", (), "rank, summed over the tokens"),
                      "12wd": ("program (12wd)", ("U1", "U2"), "rank, summed over the tokens"),
                      "mhsa": ("program (6) (linear MHSA)", (), "rank"),
                      "gated_mhsa": ("gated-ReLU MHSA program", ("H",), "rank, summed over the gates"),
                      "mixer": ("gated-ReLU token-mixing program (MLP-Mixer)", ("G",), "rank, summed over the gates")}
    X = np.random.default_rng(3).standard_normal((6, 3, 2))
    for name, fam in registry.families().items():  # the label a family reports is its programs'
        y = X[:, 0, 0] if name == 8 else X[:, 0, :1]
        assert ct.make_problem(X, y, program=name, gates=2, beta=1.0).program.label == fam.label


def test_the_static_list_of_built_in_families_is_what_their_modules_register():
    # the command line's help reads registry.MODULES without importing the modules; each module registers
    # exactly the names listed for it
    import importlib
    import sys
    for module, names in registry.MODULES.items():
        assert module in sys.modules or importlib.import_module(module)
        assert {n for n, f in registry.families().items() if f.program.__module__ == module
                or f.reduction.__module__ == module} == set(names)
    assert set(registry.builtin_names()) == set(registry.families())
    from cvxtransformer.cli.options import PROGRAMS
    assert PROGRAMS == tuple(str(n) for n in registry.builtin_names())


def test_gate_arrays_are_declared_by_the_families(monkeypatch):
    assert registry.gate_arrays() == {"U1": "gate vectors", "U2": "gate vectors", "H": "gate matrices",
                                      "G": "gate vectors"}
    X = np.random.default_rng(0).standard_normal((8, 3, 2))
    with pytest.raises(InvalidInputError, match=r"^Q: expected the gate arrays of a program family \(U1, U2, H, G"):
        ct.make_problem(X, X[:, 0, :1], program=12, beta=1.0, Q=np.ones((2, 3)))
    with pytest.raises(InvalidInputError, match=r"^H: expected no gate matrices for program \(12\).*'gated_mhsa'"):
        ct.make_problem(X, X[:, 0, :1], program=12, beta=1.0, H=np.ones((2, 2, 2)))
    # a family declares a new gate array on its program class; make_problem passes it by name
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    seen = {}

    class Toy(AttentionProgram):
        gate_array_kinds = {"W": "toy gates"}

        @classmethod
        def build(cls, name, X, y, T, W=None, gates=None, gate_seed=0):
            seen["W"] = W
            return AttentionProgram.build(10, X, y, T)

    with pytest.raises(InvalidInputError, match=r"^options: expected .*gate_array_kinds declares \(W\), got V"):
        registry.register("toy", Toy, Proposition1, ("squared",), ("V",))
    registry.register("toy", Toy, Proposition1, ("squared",), ("W",))
    assert registry.families()["toy"].gate_arrays == ("W",) and registry.gate_arrays()["W"] == "toy gates"
    ct.make_problem(X, X[:, 0, :1], program="toy", beta=1.0, W=np.arange(3.0))
    np.testing.assert_array_equal(seen["W"], np.arange(3.0))


def test_compare_models_and_colours_come_from_the_families_declarations():
    from cvxtransformer.comparison.models import DEFAULT_MODELS, MODELS, _imported
    from cvxtransformer.comparison.plots import _colour

    declared = {m: (name, spec) for name, fam in registry.families().items()
                for m, spec in fam.reduction.models.items()}
    own = {"alternative", "gated", "alternative_wd", "gated_wd", "softmax", "convex"}  # the attention networks'
    assert set(declared) - {"softmax"} == set(MODELS) - own
    for model, (name, spec) in declared.items():
        assert name in MODELS[model].programs
        if spec:
            row = MODELS[model]
            assert row.equation == spec["equation"] and _colour(model) == spec["colour"]
            assert (row.bounding is not None) == spec.get("bounded", True)
            assert row.build.func is _imported and row.build.args == (spec["build"],)
            assert (model in DEFAULT_MODELS[name]) == bool(spec.get("default"))
    X = np.random.default_rng(0).standard_normal((6, 3, 2))
    P = ct.make_problem(X, X[:, :1, :], program="mixer", beta=1.0, gates=2)
    net = MODELS["mixer"].build(P, 3, False, 0)  # the builder named by the family, imported when called
    assert type(net).__name__ == "GatedMixer"


def test_testing_cases_are_the_families_declared_cases(monkeypatch):
    from cvxtransformer import testing

    assert testing.CASES == [(n, loss, kind) for n, f in registry.families().items() for loss, kind in f.cases]
    assert {c[0] for c in testing.CASES} == set(registry.families())  # every built-in family has cases
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    with pytest.raises(InvalidInputError, match=r"^cases: expected .* a loss of \('squared',\), got \('logistic'"):
        registry.register("toy", AttentionProgram, Proposition1, ("squared",), cases=(("logistic", "binary"),))
    assert "toy" not in registry.families()


def test_the_family_modules_exports_are_the_packages():
    """``cvxtransformer`` names no family module: ``ct.X`` finds each built-in family module's ``__all__``
    (the modules of registry.MODULES), and ``ct.__all__``/``dir(ct)`` list them."""
    import importlib

    import cvxtransformer

    with open(cvxtransformer.__file__) as f:
        source = f.read()
    public = set(cvxtransformer.__all__)
    for module in registry.MODULES:
        names = getattr(importlib.import_module(module), "__all__", ())
        assert names and module not in source
        for name in names:
            assert getattr(cvxtransformer, name) is getattr(importlib.import_module(module), name)
            assert name in public and name in dir(cvxtransformer)
    assert {"LinearMHSAProgram", "MHSAHeads", "GatedMHSAHeads", "attention_masks", "MixerProgram"} <= public


# ----------------------------------------------------------------------------- the torch operator's faces (issue #43)
def _mixer_problem(program_class, gates=2):
    X = np.random.default_rng(4).standard_normal((12, 3, 2))
    return ct.make_problem(X, X[:, :1, :], program="toy", beta=1.0, gates=gates)


def _class_faces(regularizer):
    """The operator faces checked on a class (every one a working set or the backend calls)."""
    return list(dict.fromkeys(f for faces in (*contracts.OPERATOR_FACES.values(),
                                              *contracts.WORKING_SET_FACES[regularizer].values()) for f in faces))


@pytest.mark.parametrize("face", _class_faces("nuclear_norm"))
def test_an_operator_face_removed_is_refused_at_registration_with_one_error_naming_it(face, monkeypatch):
    from cvxtransformer.core.design import DesignOperator
    from cvxtransformer.core.mixer import MixerProgram, MixerReduction

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    lacking = type("Lacking", (DesignOperator,), {face: None})
    program = type("Toy", (MixerProgram,), {"operator_class": lacking})
    with pytest.raises(InvalidInputError) as info:
        registry.register("toy", program, MixerReduction, ("squared",), ("G", "gates", "gate_seed"))
    message = str(info.value)
    assert message.startswith("register: operator of family 'toy': Lacking lacks ") and "\n" not in message
    assert message.split(" lacks ")[1].startswith(f"{face} (") and f"needs {face}" in message
    assert "toy" not in registry.families()


@pytest.mark.parametrize("face", _class_faces("nuclear_norm") + list(contracts.OPERATOR_ATTRIBUTES))
def test_an_operator_face_removed_is_refused_before_the_first_iteration(face, monkeypatch):
    """A program that declares no operator_class (as a user's file may): its operator is checked when it
    is made, before any product; never an AttributeError in the middle of a solve or a certificate."""
    from cvxtransformer.core.design import DesignOperator
    from cvxtransformer.core.mixer import MixerProgram, MixerReduction

    class Lacking(DesignOperator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if face in contracts.OPERATOR_ATTRIBUTES:
                delattr(self, face)

    if face not in contracts.OPERATOR_ATTRIBUTES:
        setattr(Lacking, face, None)

    class Toy(MixerProgram):
        operator_class = None

        def _make_operator(self, Xs, device, chunk):
            return Lacking(self, Xs, device, chunk, self.shards)

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    registry.register("toy", Toy, MixerReduction, ("squared",), ("G", "gates", "gate_seed"))
    P = _mixer_problem(Toy)
    for run in (lambda: ct.solve(P, "fista"), lambda: ct.certify(P, P.zeros())):
        with pytest.raises(InvalidInputError) as info:
            run()
        message = str(info.value)
        assert message.startswith("gated-ReLU token-mixing program (MLP-Mixer): its torch operator: Lacking lacks ")
        assert face in message.split(" lacks ")[1].split(" (")[0].split(", ") and "\n" not in message


def test_the_gram_fast_path_needs_its_declared_layout(monkeypatch):
    from cvxtransformer.core.attention import AttentionOperator

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    for layout in (None, ("output", "gate", "token", "feature")):
        program = type("Toy", (AttentionProgram,), {
            "operator_class": type("Relaid", (AttentionOperator,), {"coefficient_layout": layout})})
        with pytest.raises(InvalidInputError, match=r"^register: operator of family 'toy': Relaid lacks coeff"
                                                    r"icient_layout \(its fast path gram needs coefficient_layout; "
                                                    r"its fast path weighted_gram needs coefficient_layout\) \(coef"
                                                    r"ficient_layout: the Gram paths assume \('gate', 'output', "
                                                    r"'token', 'feature'\)\)"):
            registry.register("toy", program, Proposition1, ("squared",))
    without = type("NoGram", (AttentionOperator,), {"gram": None, "weighted_gram": None, "cross_gram": None,
                                                    "coefficient_layout": None})
    registry.register("toy", type("Toy", (AttentionProgram,), {"operator_class": without}), Proposition1, ("squared",))


def test_the_built_in_operators_offer_every_face():
    X = np.random.default_rng(5).standard_normal((9, 3, 2))
    tokens = np.eye(2)[np.random.default_rng(6).integers(0, 2, (9, 3))]  # one-hot tokens: the token operator
    for name, fam in registry.families().items():
        declared = fam.program.operator_class
        assert declared is not None, name
        for cls in declared if isinstance(declared, tuple) else (declared,):
            assert contracts.missing_operator_faces(cls, fam.program.regularizer_class, instance=False) == {}
        for data in (X, tokens):
            y = data[:, 0, 0] if name == 8 else data[:, :1, :] if name == "mixer" else data[:, 0, :1]
            op = ct.make_problem(data, y, program=name, gates=2, beta=1.0).program.operator()
            assert contracts.missing_operator_faces(op, fam.program.regularizer_class) == {}
            assert isinstance(op, declared)
