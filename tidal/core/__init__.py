"""The pure heart of Tidal, imported by both the live control plane (`tidal.platform`) and the
simulator (`tidal.sim`): the job state machine (`state`), the snapshot/decision types and the
co-optimization policy (`policy`), and the reconcile step (`controller`). Nothing here calls
Ray, reads a clock or draws a random number.
"""
