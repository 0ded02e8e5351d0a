"""Attention kernels (gpt-oss: paged decode attention with sinks and a 128-key sliding window)."""
