"""The inverses of the bottleneck kernel matrix: Newton vs exact solvers."""
import pytest
import torch

from mmsoft.models.layers import gaussian_kernel, kernel_inverse
from mmsoft.models.layers.kernel_inverse import (cholesky_regularised_inverse,
                                                 newton_pseudo_inverse,
                                                 newton_regularised_inverse)


def random_kernel_matrices(batch=3, tokens=24, dims=8, spread=0.6, seed=0):
    """Gaussian-kernel matrices of random points, float64: (batch, m, m)."""
    generator = torch.Generator().manual_seed(seed)
    points = spread * torch.randn(batch, tokens, dims, generator=generator,
                                  dtype=torch.float64)
    return gaussian_kernel(points, points)


def relative_error(actual, expected):
    return float((actual - expected).norm() / expected.norm())


def test_gaussian_kernel_matches_pairwise_distances():
    x = torch.randn(2, 5, 7, dtype=torch.float64)
    y = torch.randn(2, 4, 7, dtype=torch.float64)
    expected = torch.exp(-0.5 * torch.cdist(x, y).pow(2))
    torch.testing.assert_close(gaussian_kernel(x, y), expected)


def test_newton_converges_to_regularised_inverse():
    mats = random_kernel_matrices()
    eye = torch.eye(mats.shape[-1], dtype=mats.dtype)
    expected = torch.linalg.inv(mats + 0.01 * eye)
    assert relative_error(newton_regularised_inverse(mats, 20), expected) < 1e-4


def test_newton_pseudo_inverse_matches_pinv_on_well_conditioned():
    # Well separated points: A is close to the identity, far from singular.
    mats = random_kernel_matrices(spread=2.0)
    assert torch.linalg.cond(mats).max() < 100
    expected = torch.linalg.pinv(mats)
    assert relative_error(newton_pseudo_inverse(mats, 20), expected) < 1e-4


def test_newton_scaling_is_per_matrix():
    """An image's inverse must not depend on its batch-mates."""
    mats = random_kernel_matrices(batch=2, spread=2.0)
    scaled_mate = torch.stack((mats[0], mats[1] * 50))
    for variant in ('soft', 'soft++'):
        alone = kernel_inverse(mats[:1], variant, 'newton')
        in_batch = kernel_inverse(scaled_mate, variant, 'newton')[:1]
        torch.testing.assert_close(alone, in_batch)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_newton_and_exact_solver_agree(variant):
    mats = random_kernel_matrices(spread=2.0 if variant == 'soft++' else 0.6)
    newton = kernel_inverse(mats, variant, 'newton', 20)
    exact = kernel_inverse(mats, variant, 'cholesky')
    assert relative_error(newton, exact) < 1e-4


def test_cholesky_is_exact_regularised_inverse():
    mats = random_kernel_matrices(spread=0.1)  # nearly rank-deficient A
    eye = torch.eye(mats.shape[-1], dtype=mats.dtype)
    product = cholesky_regularised_inverse(mats) @ (mats + 0.01 * eye)
    torch.testing.assert_close(product, eye.expand_as(product), atol=1e-9, rtol=0)


@pytest.mark.parametrize('variant,solver', [('soft', 'newton'), ('soft', 'cholesky'),
                                            ('soft++', 'newton'),
                                            ('soft++', 'cholesky')])
def test_gradient_is_that_of_the_inverse(variant, solver):
    points = 2.0 * torch.randn(2, 6, 3, dtype=torch.float64)
    mats = gaussian_kernel(points, points).requires_grad_()
    # gradcheck compares the analytic backward (-V^T G V^T) against finite
    # differences of the forward, which for a converged solver is the inverse.
    assert torch.autograd.gradcheck(
        lambda a: kernel_inverse(0.5 * (a + a.transpose(-1, -2)), variant, solver,
                                 40), (mats, ), eps=1e-6, atol=1e-4)


def test_forward_builds_no_graph_of_iterations():
    mats = random_kernel_matrices().requires_grad_()
    out = kernel_inverse(mats, 'soft', 'newton')
    # One node for the whole inverse, not 20 iterations of matmuls.
    assert type(out.grad_fn).__name__ == '_KernelInverseBackward'
    assert out.grad_fn.next_functions[0][0].variable is mats


def test_unknown_variant_or_solver_raises():
    mats = random_kernel_matrices()
    with pytest.raises(ValueError, match="variant='softmax'"):
        kernel_inverse(mats, 'softmax')
    with pytest.raises(ValueError, match="solver='lu'"):
        kernel_inverse(mats, 'soft', 'lu')


def test_soft_plus_plus_scale_is_shared_by_the_heads_of_an_image():
    # (images, heads, m, m): head 1 of image 0 has larger row sums; its scale
    # sets the starting point of image 0's other head too, not of image 1.
    mats = random_kernel_matrices(batch=4, spread=0.3).reshape(2, 2, 24, 24)
    alone = newton_pseudo_inverse(mats[1:], 3)
    torch.testing.assert_close(newton_pseudo_inverse(mats, 3)[1:], alone)
    head_alone = newton_pseudo_inverse(mats[:1, :1], 3)
    assert not torch.allclose(newton_pseudo_inverse(mats, 3)[:1, :1], head_alone)
