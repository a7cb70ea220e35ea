"""Observing the platform while the workload runs: Prometheus."""
