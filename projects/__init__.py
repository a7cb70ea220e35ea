"""What a test *is*: the config engine, templates, matrix expansion, and one folder per project."""
