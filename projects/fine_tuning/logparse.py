r"""Parse the trainer's log lines (fms-hf-tuning image and the local workload alike).

Three kinds of lines matter::

    dataset stats: {"total_tokens": 51234, "total_samples": 400, ...}
    {'loss': 2.91, 'grad_norm': 1.7, 'learning_rate': 4.5e-05, 'epoch': 0.5}
    {'train_runtime': 41.2, 'train_samples_per_second': 9.7, ..., 'epoch': 1.0}

Tolerated: values quoted as strings (transformers 5.x), ``nan``/``inf``, a missing
``grad_norm``, ANSI colour codes, and progress bars glued before the dict (``\r``-separated
tqdm frames). transformers 5.x reports ``train_tokens_per_second`` on the periodic lines, not
in the summary: the last periodic value is used when the summary lacks it.

The file is streamed line by line: a multi-GB log never sits in memory (only the loss
curve, one small record per logging step, is kept).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from pydantic import BaseModel, Field

__all__ = ["DatasetStats", "LogMetrics", "Progress", "TrainSummary", "parse_numbered_lines",
           "parse_train_log"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PAIR = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'\s*:\s*('?)([^',}]*)\2")
_STATS = "dataset stats:"
# The usual periodic line, unquoted values, grad_norm optional: parsed in one match. Any
# other shape (quoted values, more keys, another order) takes the general pair parser.
_N = r"([-+0-9.eEnaNiIf]+)"
_PLAIN_PROGRESS = re.compile(
    rf"\{{'loss': {_N}, (?:'grad_norm': {_N}, )?'learning_rate': {_N}, 'epoch': {_N}\}}\s*")


class DatasetStats(BaseModel):
    """The dataset as the trainer saw it."""

    total_tokens: float | None = None
    total_samples: float | None = None
    avg_tokens_per_sample: float | None = None
    max_seq_token: float | None = None


class Progress(BaseModel):
    """The periodic training log lines, column by column (one entry per line).

    Columnar on purpose: a long run logs thousands of lines, and one list per metric keeps
    the parse cache small and fast to load.
    """

    loss: list[float | None] = Field(default_factory=list)
    grad_norm: list[float | None] = Field(default_factory=list)
    learning_rate: list[float | None] = Field(default_factory=list)
    epoch: list[float | None] = Field(default_factory=list)
    train_tokens_per_second: list[float | None] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.loss)

    def append(self, values: dict[str, float | None]) -> None:
        """Add one log line's values (missing metrics become None)."""
        for name in _PROGRESS_FIELDS:
            getattr(self, name).append(values.get(name))


_PROGRESS_FIELDS = ("loss", "grad_norm", "learning_rate", "epoch", "train_tokens_per_second")


class TrainSummary(BaseModel):
    """The trainer's end-of-training summary."""

    train_runtime: float | None = None
    train_samples_per_second: float | None = None
    train_steps_per_second: float | None = None
    train_tokens_per_second: float | None = None
    train_loss: float | None = None
    epoch: float | None = None
    train_start: float | None = Field(default=None, description="When the training steps "
                                      "began (Unix time; the local trainer prints it).")
    train_end: float | None = Field(default=None, description="When they ended.")


class LogMetrics(BaseModel):
    """Everything the log told us, plus what looked wrong (line, message)."""

    dataset_stats: DatasetStats | None = None
    progress: Progress = Field(default_factory=Progress)
    summary: TrainSummary | None = None
    problems: list[tuple[int, str]] = Field(default_factory=list, description="(where, "
                                            "message): ``where`` as the lines were given")


def _number(text: str) -> float | None:
    try:
        return float(text)  # float() ignores surrounding whitespace itself
    except ValueError:
        return None


def _dict_pairs(fragment: str) -> dict[str, float | None]:
    # The hot loop of a cold parse (one call per logging step): inlined, no call per value.
    pairs: dict[str, float | None] = {}
    for key, _, value in _PAIR.findall(fragment):
        try:
            pairs[key] = float(value)
        except ValueError:
            pairs[key] = None
    return pairs


def _fields(model: type[BaseModel], values: dict[str, float | None]) -> dict[str, float | None]:
    return {k: v for k, v in values.items() if k in model.model_fields}


def parse_train_log(lines: Iterable[str]) -> LogMetrics:
    """Parse trainer log lines into dataset stats, the loss curve and the summary.

    Args:
        lines: The log, line by line (an open file works).

    Returns:
        The `LogMetrics`; malformed metric lines are listed in ``problems``.
    """
    return parse_numbered_lines(enumerate(lines, start=1))


def _columns(rows: list[tuple[str | None, ...]]) -> list[list[float | None]]:
    """The plain lines' values, column by column, as numbers (None: absent or not a number).

    One C-level ``map(float, ...)`` a column; a column with an absent value (grad_norm is
    optional) or an odd one (``nan?``) takes a per-value path.
    """
    out: list[list[float | None]] = []
    for texts in zip(*rows, strict=True):
        try:
            out.append(list(map(float, texts)))  # type: ignore[arg-type]
            continue
        except TypeError:  # an absent value (grad_norm is optional)
            pass
        except ValueError:
            out.append([None if text is None else _number(text) for text in texts])
            continue
        try:
            out.append([None if text is None else float(text) for text in texts])
        except ValueError:
            out.append([None if text is None else _number(text) for text in texts])
    return out


def parse_numbered_lines(lines: Iterable[tuple[int, str]]) -> LogMetrics:
    """`parse_train_log` over ``(where, line)`` pairs.

    ``where`` is the line's number or byte offset: ``problems`` carry it back (e.g.
    `analysis.parsing.FileReader.matching_spans` gives offsets, whose lines
    `~analysis.parsing.FileReader.line_numbers` finds for the few problems). Only lines
    holding a ``{`` matter, so a caller may pass just those, which skips a log's
    progress-bar noise.
    """
    out = LogMetrics()
    summary: dict[str, float | None] = {}
    last_tokens_rate: float | None = None
    progress = out.progress
    plain = _PLAIN_PROGRESS.fullmatch
    rows: list[tuple[str | None, ...]] = []  # plain periodic lines not yet in the columns

    def flush() -> None:
        # the hot path of a cold parse: per line one regex match, per column one conversion
        if not rows:
            return
        for column, values in zip((progress.loss, progress.grad_norm, progress.learning_rate,
                                   progress.epoch), _columns(rows), strict=True):
            column += values
        progress.train_tokens_per_second += [None] * len(rows)
        rows.clear()

    for lineno, raw in lines:
        brace = raw.find("{")
        if brace < 0:
            continue
        # A plain dict, alone or after a progress bar it is glued to (what the general path
        # below would read from its frame, without splitting the line into frames)
        if (match := plain(raw, brace)) is not None and (
                brace == 0 or _STATS not in raw[:brace]):
            rows.append(match.groups())
            continue
        line = _ANSI.sub("", raw) if "\x1b" in raw else raw
        # Progress bars redraw with \r: the metrics are in the frame that holds a dict.
        for frame in line.split("\r") if "\r" in line else (line,):
            start = frame.find("{")
            if start < 0:
                continue
            if _STATS in frame[:start]:
                try:
                    data = json.loads(frame[start:].strip(), parse_constant=lambda c: math.nan)
                    out.dataset_stats = DatasetStats(**_fields(DatasetStats, {
                        k: _number(str(v)) for k, v in data.items()}))
                except (ValueError, TypeError, AttributeError) as exc:
                    out.problems.append((lineno, f"bad dataset stats line: {exc}"))
                continue
            fragment = frame[start:]
            if "'" not in fragment:
                continue
            pairs = _dict_pairs(fragment)
            if "loss" in pairs:
                flush()  # the curve keeps the log's order
                progress.append(pairs)
                if pairs.get("train_tokens_per_second") is not None:
                    last_tokens_rate = pairs["train_tokens_per_second"]
            elif "train_runtime" in pairs:
                summary.update({k: v for k, v in _fields(TrainSummary, pairs).items()
                                if v is not None})
            elif ("'loss'" in fragment or "'train_runtime'" in fragment):
                out.problems.append((lineno, "unparsable metrics line"))
    flush()
    if summary:
        if summary.get("train_tokens_per_second") is None and last_tokens_rate is not None:
            summary["train_tokens_per_second"] = last_tokens_rate
        out.summary = TrainSummary(**summary)
    return out
