from __future__ import annotations

import math

from projects.fine_tuning.logparse import parse_train_log
from tests.factories import train_log


def test_transformers_4_log() -> None:
    metrics = parse_train_log(train_log(tokens_per_second=1234.0, runtime=40, steps=20,
                                        noise_lines=100, generation=4).splitlines(True))
    assert metrics.summary is not None
    assert metrics.summary.train_tokens_per_second == 1234.0
    assert metrics.summary.train_runtime == 40
    assert len(metrics.progress) == 20
    assert metrics.dataset_stats and metrics.dataset_stats.total_tokens == 51234
    assert metrics.progress.grad_norm[6] is None  # grad_norm missing on some lines
    assert not metrics.problems


def test_transformers_5_quoted_values_and_periodic_tokens() -> None:
    metrics = parse_train_log(train_log(tokens_per_second=987.0, generation=5).splitlines())
    assert metrics.summary is not None
    assert metrics.summary.train_tokens_per_second == 987.0  # from the periodic lines
    assert metrics.summary.train_loss is not None


def test_noise_nan_inf_ansi_progress_bars() -> None:
    lines = [
        "\x1b[1m\x1b[32m 40%|████      | 4/10 [00:01<00:01]\r{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.4}\n",
        "garbage {not a dict\n",
        "{'loss': 'inf', 'grad_norm': '-inf', 'epoch': '0.5'}\n",
        "\x1b[0m{'train_runtime': 10.0, 'train_samples_per_second': 5.0, 'train_loss': 1.5, 'epoch': 1.0}\n",
        "dataset stats: {\"total_tokens\": 1000, \"total_samples\": 10, \"avg_tokens_per_sample\": 100, \"max_seq_token\": 128}\n",
    ]
    metrics = parse_train_log(lines)
    assert math.isnan(metrics.progress.loss[0])
    assert metrics.progress.loss[1] == math.inf and metrics.progress.grad_norm[1] == -math.inf
    assert metrics.summary.train_runtime == 10.0 and metrics.summary.train_tokens_per_second is None
    assert metrics.dataset_stats.total_samples == 10


def test_bad_stats_line_is_a_problem_with_line() -> None:
    metrics = parse_train_log(["ok\n", "dataset stats: {\"total_tokens\": \n"])
    assert metrics.problems and metrics.problems[0][0] == 2


def test_plain_line_fast_path_agrees_with_the_general_parser() -> None:
    """The one-match path for the usual line gives what the pair parser gives."""
    import re

    plain = train_log(steps=30, seed=5).splitlines()
    # the same lines with their keys in another order only the general parser accepts
    reordered = [re.sub(r"^\{('loss': [^,]+), (.*)\}$", r"{\2, \1}", line) for line in plain]
    assert reordered != plain
    fast, general = parse_train_log(plain), parse_train_log(reordered)
    assert len(fast.progress) == 30 and fast.progress == general.progress
    assert None in fast.progress.grad_norm  # the optional key is absent on some lines
    odd = parse_train_log(["{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n",
                           "{'loss': -, 'learning_rate': 1e-05, 'epoch': 0.5}\n"])
    assert odd.progress.loss[1] is None and odd.progress.epoch == [0.5, 0.5]
