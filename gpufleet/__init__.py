"""gpufleet: provision multi-GPU training clusters and prove they are fit to train."""

__version__ = "0.1.0"
