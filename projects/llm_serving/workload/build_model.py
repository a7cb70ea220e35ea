"""Build the tiny served model and its tokenizer locally (nothing is downloaded).

    python -m projects.llm_serving.workload.build_model SPEC_JSON CORPUS MAX_LEN OUT_DIR

A byte-level BPE tokenizer trained on ``CORPUS`` (JSON lines, the fine-tuning dataset) and a
seeded random Llama of the spec's sizes, saved with ``save_pretrained`` so vLLM serves it and
GuideLLM tokenizes with it. Written to a temporary dir, then renamed: a half-built model is
never served.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from pydantic import ValidationError

from projects.library.tiny_lm import LocalModelSpec, build_model, build_tokenizer, read_samples


def main(argv: list[str]) -> int:
    """Build into ``OUT_DIR`` (see the module docstring)."""
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:  # the same model the config validated: its defaults, declared once
        spec = LocalModelSpec.model_validate_json(argv[0])
    except ValidationError as exc:
        print(f"error: the model spec: {exc}", file=sys.stderr)
        return 2
    corpus, max_len, out = Path(argv[1]), int(argv[2]), Path(argv[3])
    staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tokenizer = build_tokenizer(read_samples(corpus, 1), spec.vocab_size, max_len)
    model = build_model(spec, len(tokenizer), max_len, tokenizer)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        # safeio-exempt: publishes the model dir save_pretrained wrote, whole or not at all
        os.replace(staging, out)
    except OSError:
        if not out.is_dir():
            raise
        shutil.rmtree(staging)  # another run built it meanwhile (a non-empty dir): keep theirs
    print(json.dumps({"event": "built", "dir": str(out)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
