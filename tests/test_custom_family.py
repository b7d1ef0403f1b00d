"""docs/examples/custom_family.py: a family defined and registered in a user's own file (program (8)
with a weight per token in the regulariser) is solved, certified and its network recovered; its
optimum is checked against the weighted group lasso written directly in CVXPY."""
import cvxpy as cp
import numpy as np
import pytest
from conftest import load_example


def test_the_custom_family_example_runs_and_is_the_weighted_group_lasso(monkeypatch, capsys):
    out = load_example(monkeypatch, "custom_family.py").main()  # its family stays in this test
    assert "certified True" in capsys.readouterr().out

    X, y, w, beta = out["X"], out["y"], out["weights"], out["beta"]
    N, n, d = X.shape
    Z = cp.Variable((n, d))
    yhat = X.reshape(N, n * d) @ cp.reshape(Z, (n * d,), order="C")
    objective = 0.5 * cp.sum_squares(yhat - y) + beta * sum(w[k] * cp.norm(Z[k]) for k in range(n))
    direct = cp.Problem(cp.Minimize(objective))
    direct.solve(solver="CLARABEL")
    for result in out["results"].values():
        assert result.certified
        assert result.certificate.primal_objective == pytest.approx(direct.value, rel=1e-7)
    np.testing.assert_allclose(out["Z"], Z.value, atol=1e-5)
    assert out["certificate"].relative_gap <= 1e-8 and out["network"].gap <= 1e-8 * abs(direct.value)

    # compare: network (9) is bounded by the program's own optimum (program (8) on X' = X / w, the same
    # optimum as the weighted program), softmax attention (3) is not bounded
    runs = {run.model: run for run in out["comparison"].models.values()}
    assert set(runs) == {"alternative", "softmax"}
    alt = runs["alternative"]
    assert alt.certified_lower_bound <= direct.value * (1 + 1e-7)
    assert alt.certified_lower_bound == pytest.approx(direct.value, rel=1e-6)
    assert alt.objective >= direct.value * (1 - 1e-7) and alt.certified_gap >= -1e-7 * direct.value
    assert alt.certified_gap == pytest.approx(alt.objective - alt.certified_lower_bound)
    assert runs["softmax"].certified_gap is None
