"""What several test modules share: reference computations and small models.

- :mod:`tests.helpers.official_soft_reference`: the official SOFT forward,
  recomputed functionally, and random weights in its checkpoint layout.
- :mod:`tests.helpers.plain_autograd`: the plain-autograd twins of the
  memory-saving layers and the comparison of outputs and gradients.
- :mod:`tests.helpers.small_backbones`: small SOFT and UFO-ViT backbones for
  the compile and host-sync tests.
- :mod:`tests.helpers.host_syncs`: counts, on the CPU, what would make a GPU
  wait for the host.
- :mod:`tests.helpers.dataset_digest`: a content digest of a generated dataset.
- :mod:`tests.helpers.dense_models`: Mask R-CNN and UperNet around a
  backbone, and their training steps (needs mmdet and mmseg).
- :mod:`tests.helpers.tools`: the command-line tools as modules.
"""
