"""Pure parsers, one module per tool: the raw text one command printed -> plain Python values.

Every function takes the captured output (stdout, sometimes with stderr mixed in) and
returns JSON-friendly values. Output that cannot be understood raises ``ParseError``
with what was expected and a short quote of the text; nothing is guessed or defaulted.
"""

from gpufleet.errors import ParseError

__all__ = ["ParseError"]
