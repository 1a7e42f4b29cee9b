"""Adasum's combining rule in closed forms (no MPI): orthogonal vectors add, equal ones stay, a zero vector
changes nothing, and each tensor of a fused vector takes its own dot products."""
import numpy as np
import pytest

pytest.importorskip("torch")
from ddl.torch.adasum import combine  # noqa: E402


def test_orthogonal_vectors_add_and_equal_vectors_stay():
    a, b = np.array([3.0, 0.0, 0.0]), np.array([0.0, -2.0, 0.0])
    np.testing.assert_allclose(combine(np.stack([a, b]), [(0, 3)]), a + b)
    np.testing.assert_allclose(combine(np.stack([a, a]), [(0, 3)]), a)
    np.testing.assert_allclose(combine(np.stack([a, -a]), [(0, 3)]), np.zeros(3))  # 1.5a - 1.5a: opposites cancel


def test_a_zero_vector_passes_its_partner_through():
    b = np.array([1.0, 2.0, -4.0])
    np.testing.assert_allclose(combine(np.stack([np.zeros(3), b]), [(0, 3)]), b)
    np.testing.assert_allclose(combine(np.stack([b, np.zeros(3)]), [(0, 3)]), b)


def test_four_ranks_combine_in_pairs_then_pairs_of_pairs():
    rng = np.random.default_rng(3)
    v = rng.standard_normal((4, 5))

    def pair(a, b):  # the paper's operator, written out
        d = a @ b
        return (1 - d / (2 * (a @ a))) * a + (1 - d / (2 * (b @ b))) * b

    np.testing.assert_allclose(combine(v, [(0, 5)]), pair(pair(v[0], v[1]), pair(v[2], v[3])), rtol=1e-12)
    # not pairs (0, 2), (1, 3): the order is part of the operator
    assert not np.allclose(combine(v, [(0, 5)]), pair(pair(v[0], v[2]), pair(v[1], v[3])))


def test_each_tensor_of_a_fused_vector_takes_its_own_dot_products():
    # first tensor: equal on both ranks (stays); second: orthogonal (adds)
    a = np.array([1.0, 1.0, 5.0, 0.0])
    b = np.array([1.0, 1.0, 0.0, 7.0])
    np.testing.assert_allclose(combine(np.stack([a, b]), [(0, 2), (2, 4)]), [1.0, 1.0, 5.0, 7.0])
    # one dot product over the whole: neither rule
    assert not np.allclose(combine(np.stack([a, b]), [(0, 4)]), [1.0, 1.0, 5.0, 7.0])
