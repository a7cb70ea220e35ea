"""The ``tests.<project>`` block every project shares, and the engine's view of a config.

A project's config model subclasses `EngineConfig` and declares ``tests`` with its own
`TestBlock` subclass, whose ``test_settings`` is the project's settings model. The engine reads
only what is declared here: the matrix, the walk (``stop_on_error``, timeouts), the
namespace, and the multi-user fan-out.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import Field, PrivateAttr, ValidatorFunctionWrapHandler, model_validator

from analysis.settings import AnalysisSettings
from core.strict import DnsLabel, StrictSettings
from projects.library.clusters import ClustersBlock
from projects.library.export import ExportBlock
from projects.library.notify import NotifyBlock
from projects.library.observe import ObserveBlock
from projects.library.operators import PrepareBlock
from projects.library.secrets import SecretsBlock

__all__ = ["EngineConfig", "MatrixBlock", "MultiUserBlock", "PrCommentBlock", "TestBlock"]


class MultiUserBlock(StrictSettings):
    """Multi-user fan-out: N users of the cell's workload at once (any project)."""

    enabled: bool = Field(default=False, description="Run N users at once.")
    user_count: int = Field(default=1, ge=1, le=100_000, description="Number of users (N).")
    batch_size: int = Field(default=1, ge=1, le=100_000,
                            description="Users released per stagger step.")
    sleep_factor: float = Field(default=0.0, ge=0, le=3600,
                                description="Seconds between stagger steps.")
    abort_on_failure: bool = Field(default=False, description="Stop all users on a failure.")
    need_all_success: bool = Field(default=False, description="k < N successes fails the test.")
    deploy_s3: bool = Field(default=False, description="Cluster fan-out: prepare deploys an "
                            "in-cluster S3 server (MinIO) in the test namespace.")
    s3_endpoint: str | None = Field(default=None, description="Cluster fan-out: S3 endpoint as "
                                    "the pods reach it (barrier and per-user artifacts).")
    s3_external_endpoint: str | None = Field(default=None, description="The same S3 as "
                                             "Telltale reaches it (default: s3_endpoint).")
    s3_bucket: str = Field(default="telltale-users", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
                           description="Bucket of the fan-out (an S3 bucket name).")
    collect_batch: int = Field(default=50, ge=1, le=10_000,
                               description="Users collected per task.")
    command: list[str] | None = Field(default=None, description="Cluster fan-out: workload "
                                      "argv in each user pod (default: the project's).")


class TestBlock(StrictSettings):
    """``tests.<project>``: what the test runs and how the matrix is walked."""

    namespace: DnsLabel = Field(default="telltale-testing",
                           description="Cluster namespace of the workload.")
    stop_on_error: bool = Field(default=False, description="A failed cell stops the matrix.")
    timeout_minutes: int = Field(default=60, ge=1, le=7 * 24 * 60,
                                 description="Deadline of one cell, in minutes.")
    skip_if: list[dict[str, Any]] = Field(
        default_factory=list, description="A cell matching every pair of one entry is skipped."
    )
    test_settings: Any = Field(description="The project's settings (lists are dimensions).")
    test_extra_settings: list[dict[str, Any]] = Field(
        default_factory=list, description="Experiment groups merged over test_settings."
    )
    multi_user: MultiUserBlock = Field(default_factory=MultiUserBlock)
    _written: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_as_written(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        block = handler(data)
        if isinstance(data, dict) and isinstance(data.get("test_settings"), dict):
            block._written = copy.deepcopy(data["test_settings"])
        return block

    @property
    def settings_as_written(self) -> dict[str, Any]:
        """``test_settings`` as the config wrote it, validated by the typed field.

        The matrix expands these: the history keys each cell by a hash of its values as
        written, and the model would write ``epochs: 1`` back as ``1.0``.
        """
        return copy.deepcopy(self._written)


class PrCommentBlock(StrictSettings):
    """What an untrusted source (a PR comment, a deployment form) may set.

    See `projects.untrusted`: allow-listed keys, declared settings only, images only from
    the listed registries, bounded values.
    """

    allowed_keys: list[str] = Field(default_factory=list, max_length=256, description="Keys a PR "
                            "comment's '/var key: value' lines (and a deployment form's "
                            "overrides) may set (fnmatch patterns); every other is refused.")
    image_registries: list[str] = Field(
        default_factory=list, max_length=64, description="Registries an untrusted source "
        "may take images from (quay.io...); empty: it sets no image.")


class MatrixBlock(StrictSettings):
    """Limits of the test matrix."""

    max_cells: int = Field(default=256, ge=1, le=100_000, description="Most cells a run may "
                           "plan; more is refused at plan time with the count and the "
                           "settings that multiply.")


class EngineConfig(StrictSettings):
    """The blocks every project's config file has; projects add ``tests``."""

    ci_presets: dict[str, dict[str, Any] | None] = Field(default_factory=dict,
                                                         description="Named presets.")
    secrets: SecretsBlock
    clusters: ClustersBlock
    prepare: PrepareBlock = Field(default_factory=PrepareBlock)
    analysis: AnalysisSettings
    export_artifacts: ExportBlock = Field(default_factory=ExportBlock)
    observe: ObserveBlock = Field(default_factory=ObserveBlock)
    notify: NotifyBlock = Field(default_factory=NotifyBlock)
    pr_comment: PrCommentBlock = Field(default_factory=lambda: PrCommentBlock())
    matrix: MatrixBlock = Field(default_factory=lambda: MatrixBlock())
