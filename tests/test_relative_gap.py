"""Issue 33, item 1: one meaning of "certified" at every scale of the data.

The relative gap is ``(P(Z) - D(V)) / D(V)`` (docs/conventions.md, Certificates): since D(V) <= p*, a
certificate at tol means ``(P(Z) - p*) / p* <= relative_gap <= tol``, whatever the scale of the
objective. Every check here compares with an optimum computed independently of the certificate: a
tight Clarabel solve of the CVXPY problem (:func:`cvxtransformer.core.cvxpy_builders.build_primal`),
whose Z is evaluated by the problem's own ``primal_objective`` (a feasible point: an upper bound on
p*, so ``(P - p_ref) / p_ref`` never exceeds the true relative suboptimality).
"""
import json
import math

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.certificate import relative_gap, rounding_floor, verdict
from cvxtransformer.core.cvxpy_builders import build_primal
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.testing import CASES, case_id, random_problem, random_targets

TIGHT = dict(tol_gap_abs=1e-14, tol_gap_rel=1e-13, tol_feas=1e-13, tol_ktratio=1e-10, max_iter=1000)
SCALES = (1e-8, 1e-4, 1.0, 1e4)  # of the targets (squared loss): the objective scales by their square
FRACS = (0.3, 1e-2, 1e-4)  # beta / beta_max (logistic, cross-entropy: labels cannot be scaled, the optimum can)
SLACK = 1e-12  # rounding allowance, relative
N = 24  # samples of the property test's instances


def reference_Z(problem):
    """Z from an independent Clarabel solve with tight tolerances (CVXPY, not the package's solve)."""
    built = build_primal(problem)
    built.problem.solve(solver="CLARABEL", **TIGHT)
    return built.extract_Z()


def true_relative(P, p_ref):
    return (P - p_ref) / p_ref


def check_honest(cert, p_ref, what):
    """A certified result: its true relative suboptimality is at most its reported relative gap <= tol."""
    assert cert.relative_gap == relative_gap(cert.primal_objective, cert.dual_objective), what
    if cert.certified:
        assert cert.certified_by == "relative" and cert.relative_gap <= cert.tol, what
        assert true_relative(cert.primal_objective, p_ref) <= cert.relative_gap * (1 + SLACK) + SLACK, \
            (what, cert.primal_objective, p_ref, cert.relative_gap)
    else:
        assert cert.certified_by is None and cert.note, what


def user_problem(frac=0.01):
    X = np.random.default_rng(0).standard_normal((40, 4, 3))
    unit = ct.make_problem(X, X[:, 0, 0], program=8, beta=1.0)
    unit = unit.with_beta(frac * unit.beta_max())
    small = ct.make_problem(X, 1e-4 * X[:, 0, 0], program=8, beta=1.0)
    return unit, small.with_beta(frac * small.beta_max())


def test_issue33_scale_user_case_zero_is_not_certified():
    unit, problem = user_problem()
    p_ref = problem.primal_objective(1e-4 * reference_Z(unit))  # Z*(s y) = s Z*(y), p*(s y) = s^2 p*(y)
    assert p_ref == pytest.approx(1e-8 * unit.primal_objective(reference_Z(unit)), rel=1e-12)
    P0 = problem.primal_objective(problem.zeros())
    assert P0 / p_ref > 40  # the optimum is about 49 times smaller than P(0)
    cert = ct.certify(problem, problem.zeros())
    assert not cert.certified and cert.relative_gap >= true_relative(P0, p_ref) > 40
    for solver in ("fista", "clarabel"):
        result = ct.solve(problem, solver)
        cert = result.certificate
        check_honest(cert, p_ref, solver)
        assert cert.certified and np.abs(result.Z).max() > 0, solver  # not Z = 0 after 0 iterations
        assert true_relative(cert.primal_objective, p_ref) <= cert.relative_gap <= 1e-6, solver


def test_issue33_scale_edge_cases_of_the_formula():
    assert relative_gap(3.0, 2.0) == 0.5
    assert relative_gap(1e-20, 0.5e-20) == pytest.approx(1.0, rel=1e-15)  # no absolute test below 1
    assert relative_gap(1.0, 0.0) == math.inf and relative_gap(1.0, -2.0) == math.inf  # D <= 0 < P
    assert relative_gap(0.0, -1.0) == 0.0 and relative_gap(0.0, 0.0) == 0.0  # P = 0: Z is optimal
    assert verdict(1.0, -2.0, 0.5)[:2] == (math.inf, None)
    assert verdict(1.0, -2.0, 0.5, atol=3.0)[:2] == (math.inf, "absolute")  # only because atol was given
    assert verdict(0.0, -1.0, 1e-9)[:2] == (0.0, "relative")
    rel, by, note = verdict(2e-10, 1e-10, 1e-6, floor=1e-9)  # a gap at the rounding floor: said so
    assert (rel, by) == (1.0, None) and "rounding floor" in note and "atol=" in note


def test_issue33_scale_atol_certifies_only_when_given():
    _, problem = user_problem()
    rng = np.random.default_rng(1)
    Z = ct.solve(problem, "clarabel").Z + 1e-3 * np.abs(ct.solve(problem, "clarabel").Z).max() \
        * rng.standard_normal(problem.program.shape)
    plain = ct.certify(problem, Z, refine=False)
    assert not plain.certified and plain.certified_by is None and plain.atol is None
    gap = plain.duality_gap
    assert gap > 0 and plain.relative_gap > 1e-6
    absolute = ct.certify(problem, Z, refine=False, atol=2 * gap)
    assert absolute.certified and absolute.certified_by == "absolute" and absolute.atol == 2 * gap
    assert absolute.relative_gap == plain.relative_gap  # the relative gap is reported all the same
    assert not ct.certify(problem, Z, refine=False, atol=0.5 * gap).certified
    good = ct.certify(problem, ct.solve(problem, "clarabel").Z, atol=1e-300)
    assert good.certified and good.certified_by == "relative"  # the relative test comes first
    with pytest.raises(InvalidInputError, match="atol"):
        ct.certify(problem, Z, atol=-1.0)


def interpolating_problem(frac):
    X = np.random.default_rng(0).standard_normal((40, 4, 3))
    problem = ct.make_problem(X, X[:, 0, 0] + X[:, 1, 2], program=8, beta=1.0)
    return problem.with_beta(frac * problem.beta_max())


def test_issue33_scale_rounding_floor_is_said_plainly_and_atol_accepts_it():
    """Near interpolation p* is about 1e-12 of P(0): float64 cannot reach 1e-6 relative to D. fista stops
    at the floor with a status that says so (not at max_iter), the certificate says so and names an atol."""
    problem = interpolating_problem(1e-12)
    P0 = problem.primal_objective(problem.zeros())
    floor = rounding_floor(problem)
    assert floor == pytest.approx(1e3 * np.finfo(float).eps * P0, rel=1e-12)
    result = ct.solve(problem, "fista", max_iter=50_000)
    cert = result.certificate
    assert result.status.startswith("floor:") and "atol" in result.status and result.iterations < 50_000
    assert not cert.certified and cert.relative_gap > 1e-6 and cert.duality_gap <= floor
    assert "rounding floor" in cert.note and "atol=" in cert.note
    atol = float(cert.note.split("atol=")[1].split(")")[0])
    accepted = ct.solve(problem, "fista", atol=atol)
    assert accepted.certified and accepted.certificate.certified_by == "absolute"
    assert accepted.certificate.duality_gap <= atol and "atol" in accepted.status
    # the same data at a beta where float64 reaches tol: certified by the relative test, honestly
    easy = interpolating_problem(1e-6)
    p_ref = easy.primal_objective(reference_Z(easy))
    check_honest(ct.solve(easy, "fista").certificate, p_ref, "fista 1e-6 beta_max")


def test_issue33_scale_cli_atol(tmp_path, capsys):
    X = np.random.default_rng(0).standard_normal((40, 4, 3))
    path = str(tmp_path / "d.npz")
    np.savez(path, X=X, y=X[:, 0, 0] + X[:, 1, 2])
    args = ["solve", path, "--program", "8", "--loss", "squared", "--beta-frac", "1e-12", "--solver", "clarabel"]
    code = main(args + ["--json"])
    plain = json.loads(capsys.readouterr().out)
    assert code == 1 and not plain["certified"] and plain["certified_by"] is None
    assert "rounding floor" in plain["note"]
    code = main(args + ["--json", "--atol", "1e-9"])
    accepted = json.loads(capsys.readouterr().out)
    assert code == 0 and accepted["certified"] and accepted["certified_by"] == "absolute" and accepted["atol"] == 1e-9
    assert main(args + ["--atol", "1e-9"]) == 0
    text = capsys.readouterr().out
    assert "CERTIFIED (gap <= atol)" in text and "gap / D(V)" in text


def scaled_cases():
    """(case, scale, marks): targets scaled (squared), or beta's fraction of beta_max lowered (other
    losses); the smallest objective of every case runs by default, the other scales in the slow pass."""
    for case in CASES:
        scales = SCALES if case[1] == "squared" else FRACS
        for scale in scales:
            marks = () if scale == min(scales) else (pytest.mark.slow,)
            yield pytest.param(case, scale, marks=marks, id=f"{case_id(case)}-{scale:g}")


def scaled_problem(case, scale):
    """The instance, and the reference upper bound p_ref on its optimum."""
    program, loss, kind = case
    if loss != "squared":
        problem = random_problem(program, loss, kind, seed=3, N=N, frac=scale)
        return problem, problem.primal_objective(reference_Z(problem))
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, 4, 3))
    y = random_targets(kind, rng, N, 4)
    unit, scaled = (ct.make_problem(X, s * y, program=program, loss=loss, beta=1.0, gates=3, gate_seed=3)
                    for s in (1.0, scale))
    unit, scaled = unit.with_beta(0.3 * unit.beta_max()), scaled.with_beta(0.3 * scaled.beta_max())
    assert scaled.beta == pytest.approx(scale * unit.beta, rel=1e-12)
    return scaled, scaled.primal_objective(scale * reference_Z(unit))  # Z*(s y) = s Z*(y)


@pytest.mark.parametrize("case, scale", list(scaled_cases()))
def test_issue33_scale_certified_means_the_same_at_every_scale(case, scale):
    problem, p_ref = scaled_problem(case, scale)
    assert p_ref > 0
    for solver in ("fista", "clarabel"):  # fista's budget bounds the time; an honest "not certified" passes
        budget = {"max_iter": 3000} if solver == "fista" else {}
        cert = ct.solve(problem, solver, refine_time=1.0, **budget).certificate
        check_honest(cert, p_ref, (solver, scale))


@pytest.mark.slow
@pytest.mark.parametrize("case, scale", [p for p in scaled_cases() if not p.marks])
def test_issue33_scale_scs_certified_means_the_same(case, scale):
    problem, p_ref = scaled_problem(case, scale)
    check_honest(ct.solve(problem, "scs", refine_time=1.0, max_iter=5000).certificate, p_ref, ("scs", scale))
