"""Prefect blocks: typed, saved connection settings and credentials (used by tasks and flows).

Blocks arrive with the publish, cluster and QUADS work; nothing in the local main job needs
a credential.
"""
