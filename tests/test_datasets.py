"""Data sets: documented shapes, labels and split sizes, determinism under a seed (BERT: tests/test_bert_data.py)."""
import math

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.datasets import modular_division, periodicity, student_teacher


# ----------------------------------------------------------------------------- student-teacher
@pytest.mark.parametrize("teacher, sequence, shape", [("simplex", False, (50, 3)), ("softmax", False, (50, 3)),
                                                      ("softmax", True, (50, 6, 3))])
def test_student_teacher_shapes_and_determinism(teacher, sequence, shape):
    X, Y = student_teacher(N=50, n=6, d=4, c=3, teacher=teacher, sequence=sequence, seed=1)
    assert X.shape == (50, 6, 4) and Y.shape == shape
    X2, Y2 = student_teacher(N=50, n=6, d=4, c=3, teacher=teacher, sequence=sequence, seed=1)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(Y, Y2)
    assert not np.array_equal(Y, student_teacher(N=50, n=6, d=4, c=3, teacher=teacher, sequence=sequence,
                                                 seed=2)[1])


# ----------------------------------------------------------------------------- algorithmic
@pytest.mark.parametrize("p, units", [(97, 96), (15, 8), (7, 6)])
def test_modular_division_table_split_and_labels(p, units):
    data = modular_division(p=p, train_fraction=0.3, seed=0)
    N = p * units  # every x, every divisor invertible mod p
    n_train = round(0.3 * N)
    assert data.X_train.shape == (n_train, 4, p + 2) and data.X_test.shape == (N - n_train, 4, p + 2)
    assert data.y_train.shape == (n_train,) and data.y_test.shape == (N - n_train,)
    assert data.y_train.dtype == np.int64 and data.tokens_train.shape == (n_train, 4)
    tokens = np.concatenate([data.tokens_train, data.tokens_test])
    labels = np.concatenate([data.y_train, data.y_test])
    assert np.all((labels >= 0) & (labels < p))
    # All pairs, once each: the split is a partition of the table.
    assert len({(a, b) for a, _, b, _ in tokens}) == N
    assert np.all(tokens[:, 1] == p) and np.all(tokens[:, 3] == p + 1)
    x, y = tokens[:, 0], tokens[:, 2]
    assert all(math.gcd(int(b), p) == 1 for b in y)
    assert np.all((labels * y) % p == x % p)  # z = x / y  <=>  z y = x (mod p)
    # One-hot embedding of the tokens.
    np.testing.assert_array_equal(data.X_train, np.eye(p + 2)[data.tokens_train])


def test_modular_division_for_p_15_uses_the_units_as_divisors():
    data = modular_division(p=15, seed=0)
    assert sorted(set(np.concatenate([data.tokens_train, data.tokens_test])[:, 2])) == [1, 2, 4, 7, 8, 11, 13, 14]
    assert len(data.y_train) == len(data.y_test) == 60


def test_periodicity_labels():
    p = 97
    data = periodicity(p=p, train_fraction=0.5, seed=3)
    assert data.X_train.shape == (4656, 4, 99) and data.X_test.shape == (4656, 4, 99)
    for tokens, labels in ((data.tokens_train, data.y_train), (data.tokens_test, data.y_test)):
        for (x, _, y, _), z in zip(tokens[:200], labels[:200]):
            assert z == ((pow(int(x), -1, p) + y * y) * ((2 * x) % 6)) % p  # floor(log2 97) = 6
    assert periodicity(p=11, train_fraction=0.3).y_test.shape == (77,)


@pytest.mark.parametrize("make", [modular_division, periodicity])
def test_algorithmic_sets_are_deterministic_under_a_seed(make):
    a, b, c = make(p=11, seed=5), make(p=11, seed=5), make(p=11, seed=6)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a.tokens_train, c.tokens_train)


def test_random_embedding():
    data = modular_division(p=7, seed=0, embedding_dim=5)
    assert data.X_train.shape == (21, 4, 5)
    # The same token has the same embedding everywhere.
    first = {}
    for tokens, X in zip(data.tokens_train, data.X_train):
        for t, e in zip(tokens, X):
            np.testing.assert_array_equal(first.setdefault(int(t), e), e)
    np.testing.assert_array_equal(modular_division(p=7, seed=0, embedding_dim=5).X_test, data.X_test)


def test_algorithmic_data_feeds_the_cross_entropy_program():
    data = modular_division(p=5, train_fraction=0.5, seed=0)
    problem = ct.make_problem(data.X_train, data.y_train, program=10, loss="cross_entropy", beta=1.0,
                              n_classes=5)
    assert problem.T.shape == (10, 5) and problem.program.shape == (5, 4, 7)


@pytest.mark.parametrize("call, match", [
    (lambda: modular_division(p=1), "p: expected an integer modulus >= 2"),
    (lambda: modular_division(p=7.0), "p: expected"),
    (lambda: periodicity(p=7), "p: expected an integer modulus >= 8"),
    (lambda: modular_division(p=7, train_fraction=1.0), "train_fraction: expected a number in"),
    (lambda: modular_division(p=7, train_fraction=0.001), "train_fraction: expected a fraction leaving"),
    (lambda: modular_division(p=7, embedding_dim=0), "embedding_dim"),
])
def test_algorithmic_errors(call, match):
    with pytest.raises(ct.InvalidInputError, match=match):
        call()
