"""Steps that obtain machines and clusters: QUADS leases, cluster creation and teardown."""
