"""The operations the models' blocks call, each with a plain reference and
one training implementation (Triton kernels on CUDA)."""
