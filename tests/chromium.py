"""Headless Chromium (Debian's ``chromium``, installed by scripts/setup) for the HTML
report's tests: a screenshot and the DOM as the browser built it, of a file:// page only,
as root without the sandbox, in a private profile, with every network feature off and host
names resolving nowhere."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARY = "chromium"
TIMEOUT_S = 120
OFFLINE = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
           "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           "--dns-prefetch-disable")


def require() -> str:
    """The chromium binary, or skip saying why."""
    found = shutil.which(BINARY)
    if found is None:
        pytest.skip("chromium is not installed (scripts/setup installs Debian's chromium)")
    return found


@dataclass(frozen=True)
class Shot:
    """A page as Chromium rendered it."""

    png: bytes
    dom: str
    seconds: float  # the screenshot's run, browser start included


def _run(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([require(), *OFFLINE, f"--user-data-dir={profile}", *args,
                           page.resolve().as_uri()], capture_output=True, timeout=TIMEOUT_S,
                          check=False, stdin=subprocess.DEVNULL)


def render(page: Path, width: int = 1280, height: int = 2400) -> Shot:
    """Screenshot ``page`` at ``width`` x ``height`` and dump its DOM."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-chromium-") as scratch:
        profile, png = Path(scratch) / "profile", Path(scratch) / "page.png"
        start = time.monotonic()
        shot = _run(page, profile, f"--screenshot={png}", f"--window-size={width},{height}")
        seconds = time.monotonic() - start
        assert shot.returncode == 0 and png.is_file(), shot.stderr.decode(errors="replace")
        dom = _run(page, profile, "--dump-dom")
        assert dom.returncode == 0, dom.stderr.decode(errors="replace")
        return Shot(png.read_bytes(), dom.stdout.decode(), seconds)


def colours(png: bytes) -> int:
    """How many distinct colours the screenshot has (a blank page has one)."""
    from io import BytesIO

    from PIL import Image

    with Image.open(BytesIO(png)) as image:
        found = image.convert("RGB").getcolors(maxcolors=1 << 24)
    return len(found or [])
