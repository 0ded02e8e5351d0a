"""Attention kernels (gpt-oss: RoPE + paged KV-cache write, paged attention); contract: references/attention.py."""
