"""Issue 36, item 1: ``compare`` at the native width of MiniLM (d = 384), on data shaped like the
``bert-data`` block target (X and y of shape (N, n, d), so c = n d = 3072 outputs), in memory
proportional to the data plus the coefficients.

The 1.69 TiB allocation was ``Proposition1.sum_heads`` building the (m, c, n, d) array of every head's
outer product (m = n c = 24576 heads, the default of network (9)); the alternative network's scores
built an (N, m, d) array (72 MiB a sample). The subprocess test runs the command under an address-space
limit a few GiB above what importing torch takes, so either array fails it.
"""
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from cvxtransformer.core.attention import Proposition1
from cvxtransformer.core.mhsa import GatedMHSAReduction
from cvxtransformer.nn.networks import AlternativeAttention
from cvxtransformer.nn.trainer import sample_bytes

ROOT = Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def _child(argv, cwd, limit=None):
    """Run ``python argv`` with this checkout first on the path, under an address-space ``limit``
    (bytes); returns (exit code, stdout, stderr, peak RSS in bytes, seconds)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def cap():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out, err = Path(cwd) / "stdout", Path(cwd) / "stderr"
    start = time.perf_counter()
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, *argv], stdout=fo, stderr=fe, env=env, cwd=cwd, preexec_fn=cap)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    return proc.returncode, out.read_text(), err.read_text(), usage.ru_maxrss * 1024, seconds


@pytest.mark.slow
def test_issue36_compare_at_d384_on_bert_block_shaped_data_in_bounded_memory(tmp_path):
    rng = np.random.default_rng(0)
    N, n, d = 40, 8, 384  # bert-data --layer 3 --n-tokens 8 (fewer samples: a quicker solve): X, block target y
    X = rng.standard_normal((N, n, d))
    y = np.einsum("ikd,de->ike", X, rng.standard_normal((d, d)) / np.sqrt(d)) + 0.1 * rng.standard_normal((N, n, d))
    np.savez(tmp_path / "data.npz", X=X, y=y, X_test=X[:10], y_test=y[:10], teacher_attention=np.full((n, n), 1 / n))
    probe = ("import re, torch, numpy, matplotlib, cvxtransformer.cli, cvxtransformer.comparison; "
             "print(re.search(r'VmPeak:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))")
    code, out, err, base_rss, _ = _child(["-c", probe], tmp_path)
    assert code == 0, err
    base_vm = int(out) * 1024
    limit = base_vm + 4 * GIB  # the old code needs 4.5 GiB more for sum_heads alone at 64 heads, 1.69 TiB at 24576
    argv = ["-m", "cvxtransformer", "compare", "data.npz", "--program", "10", "--loss", "squared", "--beta-frac",
            "0.9", "--steps", "2", "--heads", "64", "--models", "alternative,softmax", "--out-dir", "run", "--json",
            "--quiet"]  # network (9), whose default heads were the 24576 of the issue (c >= 2 defaults to (9w) now)
    code, out, err, peak, seconds = _child(argv, tmp_path, limit)
    print(f"issue36 d=384: exit {code}, {seconds:.1f} s, peak RSS {peak / GIB:.2f} GiB (torch import alone "
          f"{base_rss / GIB:.2f} GiB RSS, {base_vm / GIB:.2f} GiB address space; limit {limit / GIB:.2f} GiB), "
          f"load {os.getloadavg()[0]:.1f}")
    assert code == 0, err[-2000:]
    s = json.loads(out)
    assert (s["N"], s["n"], s["d"]) == (N, n, d) and s["certified"]
    alt = s["models"]["alternative"]
    assert alt["heads"] == 64 and alt["certified_gap"] >= 0
    assert alt["certified_lower_bound"] == s["convex"]["10"]["dual_objective"]
    assert {"attention.png", "objective.png", "test_loss.png"} <= set(s["files"])
    Z = np.load(tmp_path / "run" / "convex_p10.npz")["Z"]
    assert Z.shape == (n * d, n, d)  # c = n d outputs per sample
    assert peak < base_rss + 2.5 * GIB  # the data, Z (75 MB), the networks and the solver's work arrays


def test_issue36_sum_heads_allocates_no_array_of_every_head_and_coefficient():
    rng = np.random.default_rng(1)
    m, c, n, d, h = 3000, 96, 8, 48, 2  # every head's outer product: m c n d doubles = 885 MB
    W1 = rng.dirichlet(np.ones(n), size=m)
    W1[::3] = np.eye(n)[rng.integers(0, n, len(W1[::3]))]  # some rows on vertices
    W2, W3 = rng.standard_normal((m, d)), rng.standard_normal((m, c))
    gate = rng.integers(0, h, m)
    tracemalloc.start()
    Z = Proposition1.sum_heads(W1, W2, W3, gate, h)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * Z.nbytes + W2.nbytes + W3.nbytes  # Z and one block of heads
    expect = np.zeros_like(Z)  # a head at a time, by the definition Z[g, l, k] += w_3j[l] w_1j[k] w_2j
    for i in range(m):
        expect[gate[i]] += W3[i][:, None, None] * W1[i][None, :, None] * W2[i][None, None, :]
    assert np.allclose(Z, expect, rtol=1e-12, atol=1e-12)
    V1, V2 = rng.standard_normal((6, 3, 3)), rng.standard_normal((6, 3, 2))
    G = GatedMHSAReduction.sum_heads(V1, V2, np.array([0, 1, 0, 2, 1, 0]), 3)
    for g in range(3):
        want = sum(np.outer(V1[i].T.ravel(), V2[i].ravel()) for i in range(6) if [0, 1, 0, 2, 1, 0][i] == g)
        assert np.allclose(G[g], want, rtol=1e-12, atol=1e-12)


def test_issue36_alternative_network_scores_keep_tokens_by_heads_not_heads_by_width():
    rng = np.random.default_rng(2)
    N, n, d, m = 6, 8, 384, 2048
    net = AlternativeAttention(n, d, 5, m, seed=0)
    X = rng.standard_normal((N, n, d))
    (Xt,) = net.encode_inputs(X)
    W1, W2 = net.W1.detach().numpy(), net.W2.detach().numpy()
    expect = np.array([[W1[j] @ X[i] @ W2[j] for j in range(m)] for i in range(N)])
    with torch.no_grad():
        assert np.allclose(net.scores(Xt).numpy(), expect, rtol=1e-10, atol=1e-10)
    kept = sample_bytes(net, (Xt,), torch.zeros((N, 5), dtype=torch.float64), "squared", 1.0)
    assert 0 < kept < m * d * 8 / 10  # was an (N, m, d) array: m d doubles a sample
