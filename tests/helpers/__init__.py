"""What several test modules share: reference computations and small models.

- :mod:`tests.helpers.official_soft_reference`: the official SOFT forward,
  recomputed functionally, and random weights in its checkpoint layout.
- :mod:`tests.helpers.plain_autograd`: the plain-autograd twins of the
  memory-saving layers and the comparison of outputs and gradients.
- :mod:`tests.helpers.small_backbones`: small SOFT and UFO-ViT backbones for
  the compile and host-sync tests.
"""
