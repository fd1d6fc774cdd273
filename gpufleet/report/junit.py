"""JUnit XML, the format CI systems and dashboards read."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.connection import local_put


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
        "name": suite,
        "tests": str(len(cases)),
        "failures": str(sum(c.failure is not None for c in cases)),
        "errors": str(sum(c.error is not None for c in cases)),
        "skipped": str(sum(c.skipped is not None for c in cases)),
        "time": f"{sum(c.time_s for c in cases):.3f}",
    })
    for case in cases:
        element = ET.SubElement(node, "testcase", {"classname": case.classname,
                                                   "name": case.name,
                                                   "time": f"{case.time_s:.3f}"})
        if case.properties:
            props = ET.SubElement(element, "properties")
            for key, value in case.properties.items():
                ET.SubElement(props, "property", {"name": key, "value": value})
        for tag, message in (("failure", case.failure), ("error", case.error),
                             ("skipped", case.skipped)):
            if message is not None:
                child = ET.SubElement(element, tag, {"message": message})
                if case.details and tag != "skipped":
                    child.text = case.details
    ET.indent(root)
    text: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return text + b"\n"


def write(path: str | Path, suite: str, cases: list[Case]) -> None:
    """Write the JUnit report atomically."""
    local_put(str(path), render(suite, cases))
