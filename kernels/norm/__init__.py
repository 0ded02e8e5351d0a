"""Normalization kernels."""
