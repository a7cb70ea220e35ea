"""Typed config blocks owned by Telltale's reusable libraries; projects compose them."""

from projects.library.clusters import ClustersBlock, CreateBlock, QuadsLabBlock, SutestBlock
from projects.library.export import (
    ExportBlock,
    HorreumExportBlock,
    OpenSearchExportBlock,
    S3ExportBlock,
)
from projects.library.kinds import APPLY, MANAGE, READ, Kind
from projects.library.operators import GpuOperatorBlock, NfdBlock, PrepareBlock, RhoaiBlock
from projects.library.secrets import SecretsBlock
from projects.library.tests import EngineConfig, MultiUserBlock, TestBlock

__all__ = [
    "APPLY",
    "MANAGE",
    "READ",
    "ClustersBlock",
    "CreateBlock",
    "EngineConfig",
    "ExportBlock",
    "HorreumExportBlock",
    "Kind",
    "GpuOperatorBlock",
    "MultiUserBlock",
    "NfdBlock",
    "OpenSearchExportBlock",
    "PrepareBlock",
    "QuadsLabBlock",
    "RhoaiBlock",
    "S3ExportBlock",
    "SecretsBlock",
    "SutestBlock",
    "TestBlock",
]
