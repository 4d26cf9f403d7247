"""Trace-driven simulator: a virtual-clock executor for the same policy code as the live system.
"""
