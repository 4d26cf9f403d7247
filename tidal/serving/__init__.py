"""Ray Serve deployments, traffic replay and the loan manager (what Serve can lend).
"""
