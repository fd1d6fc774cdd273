"""JUnit XML, the format CI systems and dashboards read.

Names, messages and details come from hosts and inventories; every one goes through
``xml_safe``, so a control character in a host's output cannot make the file invalid XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.report.outputs import local_put

_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: object) -> str:
    """Text with every character that XML 1.0 cannot hold (NUL, ESC and the other control
    characters, lone surrogates, U+FFFE/U+FFFF) replaced by its visible ``\\xNN`` or
    ``\\uNNNN`` escape."""
    def visible(match: re.Match[str]) -> str:
        code = ord(match.group(0))
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return _NOT_XML.sub(visible, str(text))


@dataclass
class Case:
    """One test case: passed unless it has a failure, an error or a skip reason."""

    classname: str
    name: str
    time_s: float = 0.0
    failure: str | None = None
    error: str | None = None
    skipped: str | None = None
    details: str = ""
    properties: dict[str, str] = field(default_factory=dict)


def render(suite: str, cases: list[Case]) -> bytes:
    """A <testsuites> document with one <testsuite>."""
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", {
        "name": xml_safe(suite),
        "tests": str(len(cases)),
        "failures": str(sum(c.failure is not None for c in cases)),
        "errors": str(sum(c.error is not None for c in cases)),
        "skipped": str(sum(c.skipped is not None for c in cases)),
        "time": f"{sum(c.time_s for c in cases):.3f}",
    })
    for case in cases:
        element = ET.SubElement(node, "testcase", {"classname": xml_safe(case.classname),
                                                   "name": xml_safe(case.name),
                                                   "time": f"{case.time_s:.3f}"})
        if case.properties:
            props = ET.SubElement(element, "properties")
            for key, value in case.properties.items():
                ET.SubElement(props, "property", {"name": xml_safe(key),
                                                  "value": xml_safe(value)})
        for tag, message in (("failure", case.failure), ("error", case.error),
                             ("skipped", case.skipped)):
            if message is not None:
                child = ET.SubElement(element, tag, {"message": xml_safe(message)})
                if case.details and tag != "skipped":
                    child.text = xml_safe(case.details)
    ET.indent(root)
    text: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return text + b"\n"


def write(path: str | Path, suite: str, cases: list[Case]) -> None:
    """Write the JUnit report atomically."""
    local_put(str(path), render(suite, cases))
