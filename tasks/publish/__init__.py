"""Steps that publish a run: S3 export, OpenSearch documents, Prefect artifacts."""

DOWNLOAD_MODES = ("cache", "important", "all")
"""What fetching a stored run takes (`tasks.publish.s3.download_run`): here, without boto3 or
Prefect, so a command line offers them before it imports either."""
