"""Start-up: a torch solve and its certificate never import CVXPY, matplotlib, scikit-learn or
transformers (checked in a fresh interpreter's ``sys.modules``); a Clarabel solve does import CVXPY,
so the check can fail. The timings are measured by benchmarks/bench_startup.py, not here."""
import json
import subprocess
import sys

HEAVY = ("cvxpy", "matplotlib", "sklearn", "transformers")

SCRIPT = """
import json, sys
import numpy as np
import cvxtransformer as ct
from cvxtransformer.cli import main

def loaded():
    return sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))

X = np.random.default_rng(0).standard_normal((30, 4, 3))
np.savez(DATA, X=X, y=X[:, 1, :2])
for program, y in ((10, X[:, 1, :2]), (12, X[:, 1, :2]), ("mhsa", X[:, :, :2])):
    P = ct.make_problem(X, y, program=program, beta=1.0)
    P = P.with_beta(0.3 * P.beta_max())
    result = ct.solve(P, "fista")
    assert ct.certify(P, result.Z + 1e-3, refine=True).dual_objective <= result.certificate.primal_objective
    ct.certify_network(P, ct.recover_weights(P, result.Z))
args = [DATA, "--program", "10", "--loss", "squared", "--beta-frac", "0.2", "--json"]
codes = [main(["solve", *args[:1], "--solver", "fista", "--out", RESULT, *args[1:]]),
         main(["verify", *args[:1], RESULT, *args[1:]])]
after_torch = loaded()
ct.solve(P, "clarabel")
print(json.dumps({"codes": codes, "torch": after_torch, "clarabel": loaded()}), file=sys.stderr)
"""


def test_a_torch_solve_and_certificate_import_no_cvxpy_matplotlib_sklearn_or_transformers(tmp_path):
    code = f"HEAVY = {HEAVY!r}\nDATA = {str(tmp_path / 'data.npz')!r}\nRESULT = {str(tmp_path / 'result.npz')!r}\n"
    out = subprocess.run([sys.executable, "-c", code + SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stderr.strip().splitlines()[-1])
    assert report["codes"] == [0, 0]
    assert report["torch"] == []
    assert report["clarabel"] == ["cvxpy"]  # the check sees a heavy import when there is one


def test_the_command_line_help_imports_no_torch():
    code = ("import sys\nfrom cvxtransformer.cli import main\nmain(['solve', '--help'])\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cvxpy', 'matplotlib'}), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr.strip().splitlines()[-1] == "[]", out.stderr[-2000:]
