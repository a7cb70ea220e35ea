"""``python -m flows.fine_tuning``: the shared project command line (`flows.project_cli`)."""

import sys

from flows.project_cli import project_main

if __name__ == "__main__":
    sys.exit(project_main("fine_tuning"))
