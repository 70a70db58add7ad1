"""Pure decisions: batch-size policies, queue ordering and admission policies.

Nothing in this package imports vLLM, NVML or threads; the engine adapters in
``tuned.engines`` and the simulator drive these objects.
"""
