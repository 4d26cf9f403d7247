"""The live control plane on Ray: the scheduler actor and the parts of its loop (admission,
runs, loans, snapshots, node requests), the executor that starts and stops runs, the SQLite
store, the SDK, the CLI and the metrics. docs/architecture.md says where each part lives.
"""
