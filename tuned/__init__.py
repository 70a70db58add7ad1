"""tuned: a live batch-size and token-budget autotuner embedded in vLLM's scheduler."""

__version__ = "0.2.0"
