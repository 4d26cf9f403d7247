"""The control plane: scheduler actor, cluster snapshot, the pure co-optimization policy,
the executor, CLI and metrics. Built by the scheduler issue.
"""
