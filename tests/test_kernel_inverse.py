"""The inverses of the bottleneck kernel matrix: the Newton iteration, its
closed form and the exact solvers."""
import importlib

import pytest
import torch

from mmsoft.models.soft import SoftAttention
from mmsoft.ops.kernel_inverse import (exact_inverse, gaussian_kernel,
                                       kernel_inverse, newton_closed_form,
                                       newton_divided_differences, newton_iterations,
                                       newton_on_eigenvalues, newton_operand,
                                       newton_scale, soft_middle, solver_that_runs)
from mmsoft.utils.torch_compat import TORCH_VERSION

kernel_inverse_module = importlib.import_module('mmsoft.ops.kernel_inverse')


def random_kernel_matrices(batch=3, tokens=24, dims=8, spread=0.6, seed=0):
    """Gaussian-kernel matrices of random points, float64: (batch, m, m).

    The smaller ``spread``, the closer the points and the worse conditioned
    the matrices (at m=240, d=32: condition 2 at spread 0.5, 1e3 at 0.2,
    4e4 at 0.1).
    """
    generator = torch.Generator().manual_seed(seed)
    points = spread * torch.randn(batch, tokens, dims, generator=generator,
                                  dtype=torch.float64)
    return gaussian_kernel(points, points)


def relative_error(actual, expected):
    return float((actual - expected).norm() / expected.norm())


def newton_inverse(mats, variant, num_iters=20):
    """The Newton iteration on the operand of ``variant`` from its scale,
    without autograd's bookkeeping: the oracle of these tests."""
    return newton_iterations(newton_operand(mats, variant),
                             newton_scale(mats, variant), num_iters)


def test_gaussian_kernel_matches_pairwise_distances():
    x = torch.randn(2, 5, 7, dtype=torch.float64)
    y = torch.randn(2, 4, 7, dtype=torch.float64)
    expected = torch.exp(-0.5 * torch.cdist(x, y).pow(2))
    torch.testing.assert_close(gaussian_kernel(x, y), expected)


def test_newton_converges_to_regularised_inverse():
    mats = random_kernel_matrices()
    eye = torch.eye(mats.shape[-1], dtype=mats.dtype)
    expected = torch.linalg.inv(mats + 0.01 * eye)
    assert relative_error(newton_inverse(mats, 'soft', 20), expected) < 1e-4


def test_newton_pseudo_inverse_matches_pinv_on_well_conditioned():
    # Well separated points: A is close to the identity, far from singular.
    mats = random_kernel_matrices(spread=2.0)
    assert torch.linalg.cond(mats).max() < 100
    expected = torch.linalg.pinv(mats)
    assert relative_error(newton_inverse(mats, 'soft++', 20), expected) < 1e-4


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
    exact = kernel_inverse(mats, variant, 'exact')
    assert relative_error(newton, exact) < 1e-4


def test_cholesky_is_exact_regularised_inverse():
    mats = random_kernel_matrices(spread=0.1)  # nearly rank-deficient A
    eye = torch.eye(mats.shape[-1], dtype=mats.dtype)
    product = exact_inverse(mats, 'soft') @ (mats + 0.01 * eye)
    torch.testing.assert_close(product, eye.expand_as(product), atol=1e-9, rtol=0)


@pytest.mark.parametrize('variant,solver', [('soft', 'newton'), ('soft', 'exact'),
                                            ('soft++', 'newton'),
                                            ('soft++', 'exact')])
def test_gradient_is_that_of_the_inverse(variant, solver):
    points = 2.0 * torch.randn(2, 6, 3, dtype=torch.float64)
    mats = gaussian_kernel(points, points).requires_grad_()
    # gradcheck compares the analytic backward (-V^T G V^T) against finite
    # differences of the forward, which for a converged solver is the inverse.
    assert torch.autograd.gradcheck(
        lambda a: kernel_inverse(0.5 * (a + a.transpose(-1, -2)), variant, solver,
                                 40), (mats, ), eps=1e-6, atol=1e-4)


def test_training_inverse_builds_no_graph_of_iterations():
    points = (0.5 * torch.randn(2, 3, 12, 8, dtype=torch.float64)).requires_grad_()
    out = soft_middle(points, 'soft++', 'newton', 20)
    # One node for the kernel, the whole iteration and the scaling.
    assert type(out.grad_fn).__name__ == 'NewtonMiddleBackward'
    assert out.grad_fn.next_functions[0][0].variable is points


def gradients(solvers, inputs, operand_of, alpha, num_iters, weights):
    """``d/d inputs`` of ``sum(weights * solve(operand_of(inputs), alpha, k))``
    for each solve of ``solvers``."""
    grads = []
    for solve in solvers:
        leaf = inputs.clone().requires_grad_()
        (solve(operand_of(leaf), alpha, num_iters) * weights).sum().backward()
        grads.append(leaf.grad)
    return grads


def autograd_through_iterations(operand, alpha, num_iters):
    """The iteration recorded step by step by autograd: the reference."""
    inverse = alpha * operand
    for _ in range(num_iters):
        inverse = 2 * inverse - inverse @ operand @ inverse
    return inverse


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_newton_and_closed_form_have_the_same_gradient(variant):
    mats = random_kernel_matrices(batch=2, tokens=40, dims=16, spread=0.3).unsqueeze(0)
    weights = torch.randn(mats.shape, generator=torch.Generator().manual_seed(2),
                          dtype=mats.dtype)
    grads = []
    for solver in ('newton', 'newton_closed_form'):
        leaf = mats.clone().requires_grad_()
        (kernel_inverse(leaf, variant, solver) * weights).sum().backward()
        grads.append(leaf.grad)
    assert relative_error(grads[0], grads[1]) < 1e-7


def test_closed_form_runs_the_iteration_off_the_closed_form_devices():
    mats = random_kernel_matrices().requires_grad_()
    assert solver_that_runs('newton_closed_form', 'cpu') == 'newton_closed_form'
    on_cpu = kernel_inverse(mats, 'soft++', 'newton_closed_form')
    assert type(on_cpu.grad_fn).__name__ == 'NewtonClosedFormBackward'
    # As on a GPU, where the float64 eigendecomposition is not used.
    solver = solver_that_runs('newton_closed_form', 'cuda')
    assert solver == 'newton'
    iterated = kernel_inverse(mats, 'soft++', solver)
    assert type(iterated.grad_fn).__name__ != 'NewtonClosedFormBackward'
    torch.testing.assert_close(iterated, on_cpu, rtol=1e-7, atol=1e-9)


def test_unknown_attention_or_solver_raises():
    with pytest.raises(ValueError, match="variant='softmax'"):
        SoftAttention(16, 2, 2, 3, variant='softmax', solver='newton')
    with pytest.raises(ValueError, match="solver='lu'"):
        SoftAttention(16, 2, 2, 3, variant='soft', solver='lu')
    assert SoftAttention(16, 2, 2, 3, solver='newton_closed_form').solver == (
        'newton_closed_form')


def test_soft_plus_plus_scale_is_shared_by_the_heads_of_an_image():
    # (images, heads, m, m): head 1 of image 0 has larger row sums; its scale
    # sets the starting point of image 0's other head too, not of image 1.
    mats = random_kernel_matrices(batch=4, spread=0.3).reshape(2, 2, 24, 24)
    alone = newton_inverse(mats[1:], 'soft++', 3)
    torch.testing.assert_close(newton_inverse(mats, 'soft++', 3)[1:], alone)
    head_alone = newton_inverse(mats[:1, :1], 'soft++', 3)
    assert not torch.allclose(newton_inverse(mats, 'soft++', 3)[:1, :1], head_alone)


# --------------------------------------------------------------------------
# The Newton iteration in closed form
# --------------------------------------------------------------------------
def scalar_newton_reference(eigvals, alpha, num_iters):
    """``(1 - (1 - alpha l^2)^(2^k)) / l``, the power taken by k squarings."""
    residual = 1 - alpha * eigvals.pow(2)
    for _ in range(num_iters):
        residual = residual * residual
    return (1 - residual) / eigvals


def test_eigenvalue_iteration_is_the_closed_formula():
    eigvals = torch.tensor([1e-3, 0.05, 0.3, 1.0, 4.0, 9.9], dtype=torch.float64)
    alpha = torch.tensor([2 / 10.0**2], dtype=torch.float64)
    for num_iters in (1, 5, 20):
        # The formula itself cancels at small eigenvalues (1 - residual with
        # residual near 1 loses eps / (alpha l^2 2^k), 5e-9 at l=1e-3, k=1).
        torch.testing.assert_close(newton_on_eigenvalues(eigvals, alpha, num_iters),
                                   scalar_newton_reference(eigvals, alpha, num_iters),
                                   rtol=1e-7, atol=0)
    # Where alpha l^2 2^k << 1 the iterate is 2^k alpha l to first order, far
    # below where the formula has any digits left; and it is 0 at l = 0.
    tiny = torch.tensor([1e-12, 1e-10], dtype=torch.float64)
    torch.testing.assert_close(newton_on_eigenvalues(tiny, alpha, 20),
                               2**20 * alpha * tiny, rtol=1e-9, atol=0)
    assert newton_on_eigenvalues(torch.zeros(1, dtype=torch.float64), alpha, 20) == 0


def test_divided_differences_match_their_definition():
    eigvals = torch.tensor([0.002, 0.01, 0.3, 0.31, 2.0, 7.5], dtype=torch.float64)
    alpha = torch.tensor([1.8 / 8.0**2], dtype=torch.float64)
    for num_iters in (2, 20):
        diff = newton_divided_differences(eigvals, alpha, num_iters)
        # The scalar iteration, checked against the formula above, has no
        # cancellation: finite differences of it are accurate.
        values = newton_on_eigenvalues(eigvals, alpha, num_iters)
        gap = eigvals[:, None] - eigvals[None, :]
        expected = (values[:, None] - values[None, :]) / gap
        off_diagonal = ~torch.eye(6, dtype=torch.bool)
        torch.testing.assert_close(diff[off_diagonal], expected[off_diagonal],
                                   rtol=1e-9, atol=0)
        # The diagonal is the derivative of g_k (central differences).
        step = 1e-7 * eigvals
        slope = (newton_on_eigenvalues(eigvals + step, alpha, num_iters)
                 - newton_on_eigenvalues(eigvals - step, alpha, num_iters)) / (2 * step)
        torch.testing.assert_close(diff.diagonal(), slope, rtol=1e-5, atol=0)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('tokens,heads', [(49, 4), (240, 2), (1050, 1)])
def test_closed_form_equals_newton_iterations(variant, tokens, heads):
    """Condition numbers ~2 and ~1e4-1e6, few and many steps (at m=1050
    only the ill-conditioned case and 20 steps, to keep the test quick)."""
    for spread in ((0.1, ) if tokens == 1050 else (0.1, 0.5)):
        mats = random_kernel_matrices(batch=heads, tokens=tokens, dims=32,
                                      spread=spread, seed=tokens)
        mats = mats.unsqueeze(0)  # (1 image, heads, m, m)
        for num_iters in ((20, ) if tokens == 1050 else (3, 30)):
            newton64 = kernel_inverse(mats, variant, 'newton', num_iters)
            closed64 = kernel_inverse(mats, variant, 'newton_closed_form', num_iters)
            assert relative_error(closed64, newton64) < 1e-5, (spread, num_iters)
            newton32 = kernel_inverse(mats.float(), variant, 'newton', num_iters)
            closed32 = kernel_inverse(mats.float(), variant, 'newton_closed_form',
                                      num_iters)
            assert closed32.dtype == torch.float32
            assert relative_error(closed32.double(), newton32.double()) < 1e-4, (
                spread, num_iters)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_closed_form_is_not_the_exact_inverse_when_ill_conditioned(variant):
    # The point of the closed form: at the conditioning of detection-size
    # bottlenecks the iteration's function is far from its limit.
    mats = random_kernel_matrices(batch=2, tokens=240, dims=32, spread=0.1).unsqueeze(0)
    closed = kernel_inverse(mats, variant, 'newton_closed_form')
    exact = kernel_inverse(mats, variant, 'exact')
    assert relative_error(exact, closed) > 1.0


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
def test_closed_form_scale_keeps_images_independent(variant):
    mats = random_kernel_matrices(batch=4, spread=0.3).reshape(2, 2, 24, 24)
    scaled_mate = torch.cat((mats[:1], mats[1:] * 3))
    alone = kernel_inverse(mats[:1], variant, 'newton_closed_form')
    in_batch = kernel_inverse(scaled_mate, variant, 'newton_closed_form')[:1]
    torch.testing.assert_close(alone, in_batch)
    torch.testing.assert_close(alone, kernel_inverse(mats[:1], variant, 'newton'))


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('num_iters', [3, 20])
def test_closed_form_gradcheck(variant, num_iters):
    mats = random_kernel_matrices(batch=2, tokens=8, dims=3, spread=1.0)
    alpha = newton_scale(mats, variant)
    # Symmetrised input: eigh reads one triangle, finite differences poke both.
    assert torch.autograd.gradcheck(
        lambda a: newton_closed_form(
            newton_operand(0.5 * (a + a.transpose(-1, -2)), variant), alpha,
            num_iters), (mats.requires_grad_(), ), eps=1e-6, atol=1e-5, rtol=1e-3,
        fast_mode=True)


@pytest.mark.parametrize('variant', ['soft', 'soft++'])
@pytest.mark.parametrize('spread', [0.1, 0.3, 1.0])
def test_closed_form_gradient_equals_autograd_through_iterations(variant, spread):
    mats = random_kernel_matrices(batch=2, tokens=49, dims=32, spread=spread)
    alpha = newton_scale(mats, variant)
    weights = torch.randn(mats.shape, generator=torch.Generator().manual_seed(3),
                          dtype=mats.dtype)
    grads = gradients((newton_closed_form, newton_iterations), mats,
                      lambda a: newton_operand(a, variant), alpha, 20, weights)
    assert relative_error(grads[0], grads[1]) < 1e-8


def test_closed_form_gradient_with_repeated_eigenvalues():
    # The identity: every eigenvalue equal, every divided difference a derivative.
    mats = torch.eye(5, dtype=torch.float64).expand(1, 2, 5, 5)
    alpha = newton_scale(mats, 'soft++')
    weights = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    grads = []
    for solve in (newton_closed_form, newton_iterations):
        leaf = mats.clone().requires_grad_()
        (solve(leaf, alpha, 4) * weights).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


def two_nearly_equal_tokens(spread: float, seed: int) -> torch.Tensor:
    """Two bottleneck tokens ``spread`` apart around a common point: (1, 1, 2, 16)."""
    generator = torch.Generator().manual_seed(seed)
    centre = 0.5 * torch.randn(1, 1, 1, 16, generator=generator)
    return centre + spread * torch.randn(1, 1, 2, 16, generator=generator)


def largest_gradient(solver: str) -> float:
    """The largest entry of d<G, pinv-like inverse>/dL over token pairs from
    coinciding (spread 1e-4) to apart (spread 1)."""
    largest = 0.
    for seed, spread in enumerate(torch.logspace(-4, 0, 40).tolist()):
        tokens = two_nearly_equal_tokens(spread, seed).requires_grad_()
        inverse = kernel_inverse(gaussian_kernel(tokens, tokens), 'soft++', solver)
        generator = torch.Generator().manual_seed(seed)
        weights = torch.randn(inverse.shape, generator=generator)
        grad, = torch.autograd.grad((inverse * weights).sum(), tokens)
        largest = max(largest, grad.abs().max().item())
    return largest


@pytest.mark.parametrize('solver', ['newton', 'newton_closed_form', 'exact'])
def test_two_bottleneck_tokens_have_bounded_gradients(monkeypatch, solver):
    bounded = largest_gradient(solver)
    # The pseudo-inverse itself, for the record: what the rule avoids.
    monkeypatch.setattr(kernel_inverse_module, 'MIN_PSEUDO_INVERSE_TOKENS', 1)
    pseudo_inverse = largest_gradient(solver)
    assert bounded < 2e3
    assert pseudo_inverse > 1e5


def test_soft_plus_plus_takes_the_regularised_inverse_of_fewer_than_three_tokens():
    for tokens, formula in [(1, 'soft'), (2, 'soft'), (3, 'soft++'), (4, 'soft++')]:
        assert kernel_inverse_module.inverse_formula('soft++', tokens) == formula
        assert kernel_inverse_module.inverse_formula('soft', tokens) == 'soft'
    mats = random_kernel_matrices(tokens=2)
    torch.testing.assert_close(kernel_inverse(mats, 'soft++', 'exact'),
                               torch.linalg.inv(mats + 0.01 * torch.eye(2)))


@pytest.mark.skipif(TORCH_VERSION < (2, 2),
                    reason='float16 autocast on the CPU needs torch >= 2.2')
def test_a_56_row_region_trains_under_float16_autocast():
    """Stage 1 of SOFT++-tiny (stride 4, bottleneck stride 8): a 56-row image
    region is 14 token rows, one bottleneck row, two bottleneck tokens."""
    from mmsoft.models.common import regions_on_grid
    from mmsoft.models.soft import SoftBlock
    torch.manual_seed(0)
    layer = SoftBlock(64, 2, sr_ratio=8, local_kernel_size=3, variant='soft++',
                      solver='newton').train()
    tokens = torch.randn(2, 14 * 32, 64, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.float16):
        out = layer(tokens, (14, 32), regions_on_grid([(14, 32), (14, 16)], (14, 32)))
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(tokens.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters()
               if p.grad is not None)


def halved_one_at_a_time(mat, max_halvings=10):
    """SOFT++'s step size as the official code finds it: halved, one test at a
    time, while ``max colsum |I - alpha A^2| > 1.01``."""
    alpha = 2 / mat.sum(-1).flatten(1).amax(1).pow(2).view(-1, 1, 1, 1)
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype)
    for _ in range(max_halvings):
        residual = (eye - alpha * mat @ mat).abs().sum(-2)  # column sums (B, h, m)
        too_large = residual.flatten(1).amax(1).view(-1, 1, 1, 1) > 1.01
        alpha = torch.where(too_large, alpha * 0.5, alpha)
    return alpha


@pytest.mark.parametrize('spread', [0.05, 0.3, 1.0, 3.0])
def test_step_size_halvings_tested_at_once_equal_one_at_a_time(spread):
    """Per image: the step size of the halvings all tested at once equals the
    one of the loop, for kernels that need none (spread 3), seven or eight."""
    generator = torch.Generator().manual_seed(int(spread * 100))
    points = spread * torch.randn(4, 3, 40, 6, generator=generator, dtype=torch.float64)
    mats = gaussian_kernel(points, points)  # (B, h, m, m)
    mats[1] = torch.rand(3, 40, 40, generator=generator, dtype=torch.float64)
    expected = halved_one_at_a_time(mats)
    torch.testing.assert_close(newton_scale(mats, 'soft++'), expected,
                               rtol=1e-12, atol=0)
