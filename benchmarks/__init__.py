"""The benchmark suite: hf_lightning against a hand-written loop, transformers.Trainer and bare Lightning.

Run `python benchmarks/run.py` (see benchmarks/README.md). Kept import-free so that a worker process's
start-up time measures only what its runner imports.
"""
