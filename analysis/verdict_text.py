"""Numbers as a verdict's explanation writes them.

A z-score said to be under a threshold is rounded down, never up to it (4.4999 is not
"4.50 SE; 4.5 needed"); one said to have passed is rounded down to one decimal. Spreads are
written as a percentage on a log scale and as a value otherwise.
"""

from __future__ import annotations

import math

from analysis.detector import _expm1


def rounded_down(z: float, places: int) -> str:
    """``z`` rounded down to ``places`` decimals, for an explanation's text.

    A z too large to scale (one of 1e307: a generated probe's KPI of -1e308 made one, an
    OverflowError) or not finite is written as it is.
    """
    scaled = z * 10 ** places
    return f"{math.floor(scaled) / 10 ** places:.{places}f}" if math.isfinite(scaled) \
        else f"{z:.4g}"


def below(z: float) -> str:
    """``z`` for a text saying it is under a threshold: rounded down, never up to it."""
    return rounded_down(z, 2)


def above(z: float) -> str:
    """``z`` for a text saying it passed a threshold: rounded down to one decimal is safe."""
    return rounded_down(z, 1)


def spread_text(spread: float, log_scale: bool) -> str:
    """A noise spread: a percentage of the level on a log scale, else in the KPI's unit."""
    return f"{_expm1(spread) * 100:.2g}%" if log_scale else f"{spread:.3g}"
