"""A tiny causal LM and its tokenizer, built locally from a dataset (nothing is downloaded).

Shared by the local workloads that need a real model without a model hub: the fine-tuning
trainer trains one, the serving project serves one. Heavy libraries (torch, transformers,
tokenizers) are imported inside the functions, so importing this module costs nothing and
works in any venv that runs a workload.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from core.strict import StrictSettings

__all__ = ["PROMPT", "LocalModelSpec", "build_model", "build_tokenizer", "read_samples"]

PROMPT = "### Instruction:\n{instruction}\n{given}### Response:\n{output}"
"""How one dataset row (``instruction/input/output``) becomes training text."""


class LocalModelSpec(StrictSettings):
    """A tiny causal LM built from a config on the local platform (no weights downloaded)."""

    architecture: Literal["llama"] = Field(default="llama", description="Model family.")
    hidden_size: int = Field(default=64, ge=8, le=4096, description="Hidden width.")
    num_hidden_layers: int = Field(default=2, ge=1, le=64, description="Transformer layers.")
    num_attention_heads: int = Field(default=4, ge=1, le=128, description="Attention heads.")
    intermediate_size: int = Field(default=128, ge=8, le=16_384, description="MLP width.")
    seed: int = Field(default=42, ge=0, le=2**32 - 1,
                      description="Seed of the random initialisation.")
    vocab_size: int = Field(default=512, ge=64, le=65_536,
                            description="BPE vocabulary trained on the dataset.")


def read_samples(path: Path, replication: int) -> list[str]:
    """Training texts of a JSON-lines dataset, ``replication`` times over (exits on bad rows)."""
    texts = []
    with path.open(encoding="utf-8") as stream:
        for lineno, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                given = f"Input: {row['input']}\n" if row.get("input") else ""
                texts.append(PROMPT.format(instruction=row["instruction"], given=given,
                                            output=row["output"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise SystemExit(f"{path}:{lineno}: bad dataset line: {exc}") from None
    if not texts:
        raise SystemExit(f"{path}: the dataset is empty")
    return texts * max(1, replication)


def build_tokenizer(texts: list[str], vocab_size: int, max_len: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` (a fast tokenizer ``transformers`` saves)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", model_max_length=max_len)


def build_model(spec: LocalModelSpec, vocab_size: int, max_len: int, tokenizer: Any) -> Any:
    """A randomly initialised (seeded) Llama of the spec's sizes (``hidden_size``, heads...)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads,
        max_position_embeddings=max_len,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)
