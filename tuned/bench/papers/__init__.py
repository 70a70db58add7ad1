"""Paper scenarios: each reproduces one seed paper's own experiment and prints ours vs the paper's figures."""
