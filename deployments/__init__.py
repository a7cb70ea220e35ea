"""Prefect deployment definitions (``prefect.yaml``) and work-pool job templates."""
