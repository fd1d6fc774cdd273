"""JUnit reports held to their consumers: the Jenkins xunit schema (junit-10.xsd, from
pytest's source distribution, fetched once into .cache/ and never committed) through
xmllint, and junitparser's reading of the counts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import junitparser
import pytest

from tests.conftest import ROOT

XSD = ROOT / ".cache" / "junit-10.xsd"
MEMBER = "testing/example_scripts/junit-10.xsd"


def junit_xsd() -> Path:
    """The schema, fetched from PyPI with pip the first time."""
    if XSD.exists():
        return XSD
    version = pytest.__version__
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                        "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:",
                        f"pytest=={version}", "-d", tmp],
                       check=True, capture_output=True, timeout=300)
        [sdist] = Path(tmp).glob("pytest-*.tar.gz")
        with tarfile.open(sdist) as archive:
            member = archive.extractfile(f"pytest-{version}/{MEMBER}")
            assert member is not None, f"{sdist.name} has no {MEMBER}"
            XSD.parent.mkdir(exist_ok=True)
            part = XSD.with_suffix(".part")
            part.write_bytes(member.read())
            part.replace(XSD)
    return XSD


def check_junit(path: Path) -> dict[str, int]:
    """Validate ``path`` under junit-10.xsd and return junitparser's counts (tests,
    failures, errors, skipped), which must agree with the file's own attributes."""
    xmllint = shutil.which("xmllint")
    assert xmllint, "xmllint missing: ./scripts/setup installs libxml2-utils"
    proc = subprocess.run([xmllint, "--noout", "--schema", str(junit_xsd()), str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    xml = junitparser.JUnitXml.fromfile(str(path))
    [suite] = list(xml)
    found = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for case in suite:
        found["tests"] += 1
        for result in case.result:
            kind = {junitparser.Failure: "failures", junitparser.Error: "errors",
                    junitparser.Skipped: "skipped"}[type(result)]
            found[kind] += 1
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (
        found["tests"], found["failures"], found["errors"], found["skipped"])
    return found
