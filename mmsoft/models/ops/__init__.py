"""The math both the layers and their memory-efficient autograd functions use.

Nothing here imports :mod:`~mmsoft.models.layers` or
:mod:`~mmsoft.models.memory_efficient`; both import from here.

* :mod:`.precision`: dtypes under mixed precision, autograd functions under
  autocast.
* :mod:`.float32_matmul`: matmuls at float32 accuracy when TF32 is on.
* :mod:`.contiguous_gradient`: the identity whose gradient is contiguous.
* :mod:`.valid_region`: each image's valid region of a padded batch.
* :mod:`.gaussian_kernel`: SOFT's Gaussian kernel.
* :mod:`.newton`, :mod:`.kernel_inverse`: SOFT's bottleneck inverse.
"""
