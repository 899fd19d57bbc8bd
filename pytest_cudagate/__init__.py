"""pytest-cudagate: a CI regression gate for CUDA kernels."""

__version__ = "0.1.0"
