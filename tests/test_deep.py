"""The deep convex network (stacked program (12)) and the standard transformer baseline."""
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.nn.deep import ConvexLayer, DeepConvexNetwork, StandardTransformer, build_model
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.core.regularizers import GroupLasso

V, n, C = 11, 4, 5


def tokens(N=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (N, n), generator=g), torch.randint(0, C, (N,), generator=g)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("kernel", [None, 16])
def test_convex_network_shapes(layers, kernel):
    net = DeepConvexNetwork(V, n, C, dim=6, layers=layers, gates=3, kernel_features=kernel)
    tok, _ = tokens()
    logits, masks = net(tok, return_masks=True)
    assert logits.shape == (37, C) and len(masks) == layers
    assert all(M.shape == (37, 3) for M in masks)
    D = 6 if kernel is None else kernel
    shapes = [b.Z.shape for b in net.blocks]
    assert shapes == [(3, n * 6, n, D)] * (layers - 1) + [(3, C, n, D)]
    mats = net.weight_matrices()
    assert list(mats) == [f"layer{i + 1}.Z" for i in range(layers)]
    assert mats[f"layer{layers}.Z"].shape == (3 * C, n * D)


@pytest.mark.parametrize("layers", [1, 2])
def test_standard_transformer_shapes(layers):
    net = StandardTransformer(V, n, C, dim=8, layers=layers, heads=2)
    tok, _ = tokens()
    assert net(tok).shape == (37, C)
    mats = net.weight_matrices()
    assert len(mats) == 6 * layers + 1
    assert mats["layer1.Wq"].shape == (8, 8) and mats["layer1.W1"].shape == (32, 8)
    assert mats["readout"].shape == (C, 8)


def test_layer_is_program_12_per_output_token():
    """A token layer with everything else fixed is SPEC.md's program (12) with sequence outputs
    (c = n * d_out, output (t, l) flattened row-major): same predictions, gates and penalty."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, n, 5))
    layer = ConvexLayer(n, 5, n * 3, gates=4, seed=2, dtype=torch.float64)
    Y = rng.standard_normal((20, n, 3))
    problem = ct.make_problem(X, Y, program=12, loss="squared", beta=0.7,
                              U1=layer.U1.numpy(), U2=layer.U2.numpy())
    Z = layer.Z.detach().numpy()
    out = layer(torch.tensor(X)).detach().numpy()
    np.testing.assert_allclose(out, problem.program.forward(Z), atol=1e-12)
    np.testing.assert_allclose(layer.mask(torch.tensor(X)).numpy(), ct.gate_mask(X, problem.program.U1, problem.program.U2))
    assert 0.7 * layer.penalty().item() == pytest.approx(GroupLasso(0.7).value(Z), rel=1e-12)
    np.testing.assert_allclose(out.reshape(20, n, 3)[:, 1], out[:, 3:6])   # token 1 is outputs 3..5


@pytest.mark.parametrize("layers, kernel", [(1, None), (2, None), (3, 8)])
def test_last_layer_with_others_fixed_is_program_12(layers, kernel):
    net = DeepConvexNetwork(V, n, C, dim=4, layers=layers, gates=3, kernel_features=kernel, seed=1,
                            dtype=torch.float64)
    tok, y = tokens()
    beta = 0.3
    problem, Z = net.last_layer_problem(tok, y.numpy(), beta)
    assert problem.program.number == 12 and problem.program.shape == Z.shape
    with torch.no_grad():
        total = net.objective(tok, y, beta).item()
        others = beta * float(net.extra_penalty()) if layers > 1 else 0.0
    assert problem.primal_objective(Z) + others == pytest.approx(total, rel=1e-10)
    # ... and it can be solved and certified like any program (12)
    result = ct.solve(problem.with_beta(0.5 * problem.beta_max()), tol=1e-5)
    assert result.certified


def test_intermediate_layer_is_convex_with_later_masks_fixed():
    """Logits are linear in an earlier layer's Z once the later masks are fixed, so the objective
    is convex along any segment (midpoint inequality on random pairs)."""
    net = DeepConvexNetwork(V, n, C, dim=4, layers=3, gates=3, seed=2, dtype=torch.float64)
    tok, y = tokens()
    with torch.no_grad():
        _, masks = net(tok, return_masks=True)
        block = net.blocks[1]
        rng = np.random.default_rng(0)
        for _ in range(5):
            Za = torch.tensor(rng.standard_normal(block.Z.shape))
            Zb = torch.tensor(rng.standard_normal(block.Z.shape))
            t = rng.uniform()
            values, logits = [], []
            for Zv in (Za, Zb, t * Za + (1 - t) * Zb):
                block.Z.copy_(Zv)
                logits.append(net(tok, masks=masks))
                values.append(net.objective(tok, y, 0.2, masks=masks).item())
            np.testing.assert_allclose(logits[2], t * logits[0] + (1 - t) * logits[1], atol=1e-9)
            assert values[2] <= t * values[0] + (1 - t) * values[1] + 1e-9


def test_embedding_tables_equal_the_generic_layer():
    net = DeepConvexNetwork(V, n, C, dim=6, layers=2, gates=3, kernel_features=8, dtype=torch.float64)
    tok, _ = tokens()
    first = net.blocks[0]
    X = net.embed(tok)
    Y, M = first.forward_tokens(net.embedding, tok)
    torch.testing.assert_close(Y, first(X), atol=1e-12, rtol=0)
    torch.testing.assert_close(M, first.mask(first.features(X)))


def test_gradients_reach_every_parameter():
    for net in (DeepConvexNetwork(V, n, C, dim=4, layers=2, gates=2, kernel_features=8),
                StandardTransformer(V, n, C, dim=4, layers=2, heads=2)):
        tok, y = tokens()
        loss = torch.nn.functional.cross_entropy(net(tok), y) + 1e-3 * net.penalty()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_seeded_initialisation_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b = StandardTransformer(V, n, C, dim=8, seed=3), StandardTransformer(V, n, C, dim=8, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c, d = DeepConvexNetwork(V, n, C, seed=3, dim=4), DeepConvexNetwork(V, n, C, seed=3, dim=4)
    assert all(torch.equal(p, q) for p, q in zip(c.parameters(), d.parameters()))


@pytest.mark.parametrize("call, match", [
    (lambda: build_model("mlp", V, n, C), "model: expected one of"),
    (lambda: build_model("standard", V, n, C, dim=6, heads=4), "heads: expected a divisor of dim = 6"),
    (lambda: build_model("standard", V, n, C, kernel_features=8), "kernel_features: expected None"),
    (lambda: DeepConvexNetwork(V, n, C, layers=0), "layers: expected an integer >= 1"),
    (lambda: DeepConvexNetwork(V, n, 1), "classes: expected an integer >= 2"),
    (lambda: DeepConvexNetwork(V, n, C, kernel_features=0), "kernel_features: expected an integer >= 1"),
])
def test_invalid_arguments(call, match):
    with pytest.raises(InvalidInputError, match=match):
        call()
