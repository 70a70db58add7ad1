"""The simulator's parts: step-time models and the discrete-event engine's helpers."""
