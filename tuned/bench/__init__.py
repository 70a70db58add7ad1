"""Benchmarks as users run them: serving metrics, goodput, SLO attainment and capacity."""
