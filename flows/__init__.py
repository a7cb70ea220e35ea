"""Prefect flows (orchestrations) and their ``python -m flows.<name>`` command lines."""
