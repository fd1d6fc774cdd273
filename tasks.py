"""invoke's view of gpufleet in a checkout: the same tasks as the ``gpufleet`` command
(``invoke provision -i lab`` is ``gpufleet provision -i lab``)."""

from gpufleet.cli import namespace

ns = namespace()
