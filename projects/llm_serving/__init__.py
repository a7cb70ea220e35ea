"""The llm_serving orchestration (scaffolded by flows.new_project)."""
