"""What drives nodes for one suite and returns data, one module per suite (named by it)."""
