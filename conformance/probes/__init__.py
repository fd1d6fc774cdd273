"""Self-contained probe programs that are copied to nodes and run there."""
