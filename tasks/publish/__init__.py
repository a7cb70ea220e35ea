"""Steps that publish a run: S3 export, OpenSearch documents, Prefect artifacts."""
