"""Cost per token from declared prices: what a million tokens cost on this configuration.

A cell's ``cost`` block declares prices — per GPU-hour, or per node-hour for a run without
GPUs (the local machine, a CPU instance) — and a currency. A project's
``cost_per_million_tokens`` KPI is the hourly price of what the cell held times the hours a
million tokens took at the measured throughput. Prices are declared, never measured or
looked up: without a price the KPI is absent, and its help text says where the figure comes
from. A changed price moves the KPI like any change of the configuration would; it is not
part of the run's identity (a history is not split by a price update).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from core.strict import StrictSettings

__all__ = ["CostBlock", "cost_per_million_tokens", "declared_cost"]


class CostBlock(StrictSettings):
    """``test_settings.cost``: declared prices (none: no cost KPI)."""

    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$",
                          description="ISO 4217 code of the prices (USD, EUR...).")
    per_gpu_hour: float | None = Field(default=None, ge=0, le=100_000,
                                       description="Price of one GPU for an hour (a run "
                                       "with GPUs is priced by its GPUs).")
    per_node_hour: float | None = Field(default=None, ge=0, le=1_000_000,
                                        description="Price of one node (instance, machine) "
                                        "for an hour: a run without GPUs is priced by its "
                                        "nodes.")


def declared_cost(settings: dict[str, Any]) -> CostBlock | None:
    """The cell's declared prices, or None (no block, or one that is not valid).

    The settings come from a result tree (untrusted): an invalid block prices nothing.
    """
    raw = settings.get("cost")
    if raw is None:
        return None
    try:
        return CostBlock.model_validate(raw)
    except ValidationError:
        return None


def cost_per_million_tokens(cost: CostBlock | None, tokens_per_second: float | None, *,
                            gpus: int, nodes: int = 1) -> float | None:
    """The price of a million tokens at ``tokens_per_second`` (the whole cell's rate).

    ``gpus`` and ``nodes``: what the cell held while it produced them (all its pods). GPUs
    are priced per GPU-hour; without GPUs, the nodes per node-hour. None without a price
    for what the cell held, or without a positive throughput.
    """
    if cost is None or not tokens_per_second or tokens_per_second <= 0:
        return None
    if gpus > 0:
        hourly = None if cost.per_gpu_hour is None else cost.per_gpu_hour * gpus
    else:
        hourly = None if cost.per_node_hour is None else cost.per_node_hour * max(nodes, 1)
    if hourly is None:
        return None
    return hourly * 1e6 / (tokens_per_second * 3600.0)
