"""Attention kernels (gpt-oss: RoPE + paged KV-cache write, paged attention with sinks and a 128-key sliding
window); contract: references/attention.py."""
