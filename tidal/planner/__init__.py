"""Per-job knowledge: plan space, memory model, fitted performance model, profiler.

Built by the planner issue; imports `tidal.jobs` types, never `tidal.platform`.
"""
