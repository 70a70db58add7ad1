"""The engine-neutral control core: what the vLLM adapter and the simulator share.

See :mod:`tuned.core.contract` for the contract between the core and an engine.
"""
