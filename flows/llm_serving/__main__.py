"""``python -m flows.llm_serving``: the shared project command line (`flows.project_cli`)."""

import sys

from flows.project_cli import project_main

if __name__ == "__main__":
    sys.exit(project_main("llm_serving"))
