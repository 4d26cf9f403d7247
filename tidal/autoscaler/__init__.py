"""Capacity changes: reclaim choice, elastic knapsack, Ray cluster autoscaler requests.
"""
