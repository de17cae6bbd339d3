"""The peer systems of ``bench_peers``: their scripts and their own environment."""
