"""The fine_tuning orchestration: ``python -m flows.fine_tuning --preset light``.

The Prefect flow itself lives in `flows.fine_tuning.flow` (importing it imports Prefect);
this package's ``__main__`` resolves config and plans without paying that cost.
"""
