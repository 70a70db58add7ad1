"""Observe: step samples from the scheduler, finished-request lengths, NVML memory."""
