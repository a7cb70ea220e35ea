"""What a test *is*: the config engine, the project contract, the matrix, one folder each."""
