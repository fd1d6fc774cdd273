"""Programs that run ON a node, shipped there as single files: they use the standard
library only and import nothing from gpufleet."""
