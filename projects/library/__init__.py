"""Typed config blocks owned by Telltale's reusable libraries; projects compose them."""

from projects.library.clusters import ClustersBlock, CreateBlock, QuadsLabBlock, SutestBlock
from projects.library.export import ExportBlock, OpenSearchExportBlock, S3ExportBlock
from projects.library.operators import GpuOperatorBlock, NfdBlock, PrepareBlock, RhoaiBlock
from projects.library.secrets import SecretsBlock

__all__ = [
    "ClustersBlock",
    "CreateBlock",
    "ExportBlock",
    "GpuOperatorBlock",
    "NfdBlock",
    "OpenSearchExportBlock",
    "PrepareBlock",
    "QuadsLabBlock",
    "RhoaiBlock",
    "S3ExportBlock",
    "SecretsBlock",
    "SutestBlock",
]
