"""``python -m flows.llm_serving``: the shared project command line (`flows.project_cli`)."""

from core.exit import exit_now
from flows.project_cli import project_main

if __name__ == "__main__":
    exit_now(project_main("llm_serving"))
