"""The leaves under every floor: user input, logging, workloads, host facts, the demo model."""
