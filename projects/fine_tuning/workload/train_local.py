"""The local fine-tuning workload: the cluster image's trainer stack in miniature.

    python -m projects.fine_tuning.workload.train_local CONFIG_JSON

``CONFIG_JSON`` is the same ``config.json`` the cluster ConfigMap carries (base trainer config
merged with ``hyper_parameters``) plus a ``telltale_local_model`` spec. The script:

1. reads the dataset (JSON lines, ``instruction/input/output``) and replicates it;
2. trains a byte-level BPE tokenizer on it locally (nothing is downloaded);
3. builds a tiny, randomly initialised causal LM from the spec (seeded);
4. wraps it with LoRA through peft when ``peft_method: lora``;
5. trains with the Hugging Face Trainer, token counting on.

With ``telltale_gpus: N`` (the cell's ``gpu``) it trains on the first N CUDA devices torch
sees (an error when there are fewer), and prints ``device: ...`` first.

It prints the lines the fms-hf-tuning image prints, so one parser reads both::

    dataset stats: {"total_tokens": ..., "total_samples": ..., "avg_tokens_per_sample": ...,
                    "max_seq_token": ...}
    {'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}
    {'train_runtime': ..., 'train_samples_per_second': ..., ..., 'train_loss': ..., 'epoch': ...}

transformers 5.x prints the values quoted and has no ``train_tokens_per_second`` in its final
summary; the Trainer's own ``num_input_tokens_seen`` count divided by ``train_runtime`` gives
the figure, which this script adds to the summary line when the Trainer left it out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.exit import exit_now
from projects.fine_tuning.trainer import TrainerConfig
from projects.library.tiny_lm import build_model, build_tokenizer, read_samples


def _apply_peft(model: Any, cfg: TrainerConfig) -> Any:
    if cfg.peft_method in (None, "none"):
        return model
    if cfg.peft_method != "lora":
        raise SystemExit(f"peft_method {cfg.peft_method!r} is not supported locally "
                         "(lora or none)")
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


class _TokenDataset:
    """Pre-tokenised samples for the Trainer (a plain sequence of dicts)."""

    def __init__(self, encodings: list[list[int]]) -> None:
        self.encodings = encodings

    def __len__(self) -> int:
        return len(self.encodings)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": self.encodings[index]}


def _format_summary(metrics: dict[str, Any]) -> str:
    """Print the final summary the way the Trainer prints its log dicts (a Python dict repr).

    ``train_start``/``train_end`` (Unix time) bound the training steps: the energy KPIs are
    measured over them, not over the process (its imports and data preparation).
    """
    keys = ["train_runtime", "train_samples_per_second", "train_steps_per_second",
            "train_tokens_per_second", "train_loss", "epoch", "train_start", "train_end"]
    return repr({k: metrics[k] for k in keys if k in metrics})


def _device(gpus: int) -> str | None:
    """The accelerator for ``gpus`` devices (None: the CPU); an error when torch sees fewer.

    Only the first ``gpus`` visible devices are used (the Trainer would spread over all).
    """
    if gpus < 1:
        return None
    # before CUDA initialises (torch does it lazily): the variable is read only then
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:gpus])
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < gpus:
        raise SystemExit(f"error: the cell asks for gpu: {gpus}, torch {torch.__version__} "
                         f"sees {seen} CUDA device(s) (set gpu: 0 to train on the CPU)")
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    return f"cuda x{gpus} ({', '.join(sorted(set(names)))})"


def _window_callback() -> Any:
    """A Trainer callback that records when the training steps begin and end."""
    import time

    from transformers import TrainerCallback

    class Window(TrainerCallback):  # type: ignore[misc]
        start: float | None = None
        end: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = time.time()

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.end = time.time()

    return Window()


def main(argv: list[str]) -> int:
    """Train according to the config file named in ``argv[0]``; returns the exit code."""
    if len(argv) != 1:
        print("usage: python -m projects.fine_tuning.workload.train_local CONFIG_JSON",
              file=sys.stderr)
        return 2
    try:
        cfg = TrainerConfig.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        print(f"error: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    if cfg.telltale_local_model is None:
        print(f"error: {argv[0]}: telltale_local_model is missing (the local trainer builds "
              "its model from it)", file=sys.stderr)
        return 2
    spec = cfg.telltale_local_model
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded

    import torch

    # the device first: a cell asking for GPUs torch cannot see is refused before the
    # seconds of transformers' import
    device = _device(cfg.telltale_gpus)
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    print(f"device: {device or 'cpu'}", flush=True)
    torch.set_num_threads(cfg.telltale_torch_threads or os.cpu_count() or 1)
    max_len = cfg.max_seq_length
    texts = read_samples(Path(cfg.training_data_path), cfg.dataset_replication)
    tokenizer = build_tokenizer(texts, spec.vocab_size, max_len)
    encodings = [tokenizer(t, truncation=True, max_length=max_len)["input_ids"] +
                 [tokenizer.eos_token_id] for t in texts]
    encodings = [e[:max_len] for e in encodings]
    lengths = [len(e) for e in encodings]
    stats = {"total_tokens": sum(lengths), "total_samples": len(lengths),
             "avg_tokens_per_sample": round(sum(lengths) / len(lengths)),
             "max_seq_token": max(lengths)}
    print(f"dataset stats: {json.dumps(stats)}", flush=True)

    model = _apply_peft(build_model(spec, len(tokenizer), max_len, tokenizer), cfg)
    args = TrainingArguments(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps or -1,
        logging_steps=cfg.logging_steps,
        # transformers 5 reads a float below 1 as a share of the steps (1.0 would be 1 step)
        warmup_steps=min(cfg.warmup_ratio, 0.999),
        weight_decay=cfg.weight_decay,
        include_num_input_tokens_seen="all",
        save_strategy="no",
        report_to="none",
        use_cpu=device is None,
        seed=spec.seed,
        dataloader_num_workers=0,
    )
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
    window = _window_callback()
    trainer = Trainer(model=model, args=args, train_dataset=_TokenDataset(encodings),
                      data_collator=collator, callbacks=[window])
    result = trainer.train()
    metrics = dict(result.metrics)
    if window.start is not None and window.end is not None:
        metrics["train_start"], metrics["train_end"] = round(window.start, 3), round(
            window.end, 3)
    if "train_tokens_per_second" not in metrics and metrics.get("train_runtime"):
        # transformers 5.x: the Trainer counted the tokens but left the rate out of the summary.
        metrics["train_tokens_per_second"] = round(
            trainer.state.num_input_tokens_seen / float(metrics["train_runtime"]), 3)
    print(_format_summary(metrics), flush=True)
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
