"""Whether a container image's CUDA runs on a node's NVIDIA driver, by NVIDIA's rules.

* **Toolkit driver.** A CUDA release runs on a driver at or above the Linux x86_64 driver of
  its toolkit: table "CUDA Toolkit and Corresponding Driver Versions" of the CUDA Toolkit
  Release Notes (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/), the GA row of
  each release.
* **Minor version compatibility.** From CUDA 11 on, a release runs with a limited feature set
  on a driver of its own major family at or above that family's minimum: table "CUDA Toolkit
  and Minimum Required Driver Version for CUDA Minor Version Compatibility" of the same notes
  and the CUDA Compatibility guide (https://docs.nvidia.com/deploy/cuda-compatibility/).
  Features that need a newer driver, and JIT compilation of PTX newer than the driver, are
  unavailable there.
* **The image's requirement.** The NVIDIA Container Toolkit checks ``NVIDIA_REQUIRE_CUDA``
  when the container starts (libnvidia-container's ``nvidia-container-cli configure
  --require``, https://github.com/NVIDIA/libnvidia-container; the toolkit's image
  configuration, https://github.com/NVIDIA/nvidia-container-toolkit). Space-separated
  alternatives are ORed and the comma-separated constraints of one alternative are ANDed. A
  constraint is KEY OP VALUE: KEY is ``cuda`` (the driver's CUDA version, the one nvidia-smi
  shows), ``driver``, ``arch`` (the GPU's compute capability) or ``brand``, and OP is one of
  ``= != < <= > >=``. Versions compare as numbers, component by component; brands compare
  without regard to case and take only ``=`` and ``!=``. If an image has ``CUDA_VERSION`` and
  no ``NVIDIA_REQUIRE_CUDA``, the toolkit requires ``cuda>=MAJOR.MINOR`` of ``CUDA_VERSION``
  (its legacy rule). ``NVIDIA_DISABLE_REQUIRE`` switches the check off, and then the two
  compatibility rules decide. NVIDIA's own images (gitlab.com/nvidia/container-images/cuda)
  add brand and driver-branch alternatives: that is forward compatibility, where the image's
  ``cuda-compat`` libraries run its CUDA on an older driver branch.

On a node with no visible GPU the container toolkit counts a constraint on an unknown brand
or arch as met. Here an unknown brand or arch meets no constraint on it, so a check that does
not know them never passes an image that the node would refuse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (10, 0): "410.48", (10, 1): "418.39", (10, 2): "440.33",
    (11, 0): "450.51.05", (11, 1): "455.23", (11, 2): "460.27.03", (11, 3): "465.19.01",
    (11, 4): "470.42.01", (11, 5): "495.29.05", (11, 6): "510.39.01", (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06", (13, 1): "590.44.01", (13, 2): "595.45.04", (13, 3): "610.43.02",
}
"""CUDA (major, minor) -> the minimum Linux x86_64 driver of that toolkit's GA release (11.0:
11.0.2 GA). There is no CUDA 12.7."""

MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
"""CUDA major -> the minimum driver for minor version compatibility within that major. For 13
the guide says ">= 580"; 580.65.06, the CUDA 13.0 GA driver, is the first R580 release."""


@dataclass(frozen=True)
class Verdict:
    """Whether the image runs on the node, the rule that decided, and a one-line reason."""

    ok: bool
    rule: str
    message: str


@dataclass(frozen=True)
class _Constraint:
    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


_Alternative = tuple[_Constraint, ...]

_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_OPERATOR_CHARS = "<>=!"
_OPERATORS = frozenset({"=", "!=", "<", "<=", ">", ">="})
_KEYS = ("cuda", "driver", "arch", "brand")


def parse_version(text: str) -> tuple[int, ...]:
    """``"570.133.20"`` -> (570, 133, 20); ValueError unless dot-separated numbers."""
    stripped = text.strip()
    if not _VERSION.fullmatch(stripped):
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in stripped.split("."))


def _compare(left: tuple[int, ...], right: tuple[int, ...]) -> int:
    width = max(len(left), len(right))
    a = left + (0,) * (width - len(left))
    b = right + (0,) * (width - len(right))
    return (a > b) - (a < b)


def _at_least(driver: tuple[int, ...], minimum: str) -> bool:
    return _compare(driver, parse_version(minimum)) >= 0


def _major_minor(text: str) -> tuple[int, int]:
    parts = parse_version(text)
    return parts[0], parts[1] if len(parts) > 1 else 0


def _release(cuda: tuple[int, int] | None) -> str:
    return "a CUDA older than 10.0" if cuda is None else f"CUDA {cuda[0]}.{cuda[1]}"


def driver_cuda(driver: str) -> tuple[int, int] | None:
    """The newest CUDA (major, minor) whose toolkit driver is at or below ``driver``."""
    version = parse_version(driver)
    newest = None
    for release, minimum in sorted(TOOLKIT_DRIVER.items()):
        if _at_least(version, minimum):
            newest = release
    return newest


def _parse_constraint(token: str) -> _Constraint:
    start = next((i for i, ch in enumerate(token) if ch in _OPERATOR_CHARS), -1)
    if start <= 0:
        raise ValueError(f"constraint {token!r} is not KEY OP VALUE")
    end = start
    while end < len(token) and token[end] in _OPERATOR_CHARS:
        end += 1
    key, op, value = token[:start].lower(), token[start:end], token[end:]
    if key not in _KEYS:
        raise ValueError(f"unknown constraint {key!r} in {token!r}")
    if op not in _OPERATORS:
        raise ValueError(f"unknown operator {op!r} in {token!r}")
    if not value:
        raise ValueError(f"constraint {token!r} has no value")
    if key == "brand":
        if op not in ("=", "!="):
            raise ValueError(f"operator {op!r} does not apply to brand in {token!r}")
    else:
        try:
            parse_version(value)
        except ValueError:
            raise ValueError(f"{value!r} in {token!r} is not a version") from None
    return _Constraint(key, op, value)


def _alternatives(expression: str) -> list[_Alternative]:
    alternatives = []
    for term in expression.strip().split(" "):
        factors = tuple(_parse_constraint(f) for f in term.split(",") if f)
        if factors:
            alternatives.append(factors)
    return alternatives


def _holds(constraint: _Constraint, *, driver: tuple[int, ...], cuda: tuple[int, int],
           brand: str | None, arch: tuple[int, ...] | None) -> bool:
    if constraint.key == "brand":
        if brand is None:
            return False
        same = brand.casefold() == constraint.value.casefold()
        return same if constraint.op == "=" else not same
    subject = {"cuda": cuda, "driver": driver, "arch": arch}[constraint.key]
    if subject is None:
        return False
    order = _compare(subject, parse_version(constraint.value))
    return {"=": order == 0, "!=": order != 0, "<": order < 0, "<=": order <= 0,
            ">": order > 0, ">=": order >= 0}[constraint.op]


def _met(alternatives: list[_Alternative], *, driver: str, cuda: tuple[int, int],
         brand: str | None, arch: str | None) -> list[_Alternative]:
    driver_v = parse_version(driver)
    arch_v = None if arch is None else parse_version(arch)
    return [alt for alt in alternatives
            if all(_holds(c, driver=driver_v, cuda=cuda, brand=brand, arch=arch_v) for c in alt)]


def requirement_met(expression: str, *, driver: str, cuda: tuple[int, int], brand: str | None,
                    arch: str | None) -> bool:
    """Whether an ``NVIDIA_REQUIRE_CUDA`` value holds for a driver, its CUDA (major, minor), a
    GPU brand and a compute capability; an empty expression holds. ValueError on a malformed
    expression, naming the constraint."""
    alternatives = _alternatives(expression)
    met = _met(alternatives, driver=driver, cuda=cuda, brand=brand, arch=arch)
    return not alternatives or bool(met)


def _needed(constraint: _Constraint | None) -> tuple[tuple[int, int], str | None] | None:
    """The CUDA release a ``cuda>=`` or ``cuda>`` constraint asks for, and its toolkit driver
    (None past the table)."""
    if constraint is None:
        return None
    wanted = _major_minor(constraint.value)
    if constraint.op == ">=":
        return wanted, TOOLKIT_DRIVER.get(wanted)
    later = [release for release in sorted(TOOLKIT_DRIVER) if release > wanted]
    return (later[0], TOOLKIT_DRIVER[later[0]]) if later else (wanted, None)


def _enforced(expression: str, source: str, *, driver: str, node: tuple[int, int] | None,
              brand: str | None, arch: str | None, image: str) -> Verdict:
    """The container toolkit's check of a requirement at container start."""
    alternatives = _alternatives(expression)
    met = _met(alternatives, driver=driver, cuda=node or (0, 0), brand=brand, arch=arch)
    cuda_alts = [alt for alt in alternatives if any(c.key == "cuda" for c in alt)]
    main = next((c for alt in cuda_alts for c in alt if c.key == "cuda" and c.op in (">=", ">")),
                None)
    wanted = str(main) if main else ",".join(str(c) for c in alternatives[0]) if alternatives \
        else "nothing"
    needed = _needed(main)
    node_text = f"the node's driver {driver} supports {_release(node)}"
    met_cuda = [alt for alt in met if any(c.key == "cuda" for c in alt)]
    if not alternatives or met_cuda or (met and not cuda_alts):
        need = "" if needed is None or needed[1] is None else \
            f" (CUDA {needed[0][0]}.{needed[0][1]} needs driver >= {needed[1]})"
        return Verdict(True, "requirement", f"{image} needs {wanted} ({source}) and {node_text}"
                       f"{need}: the container toolkit starts it")
    if met:
        without = "" if needed is None or needed[1] is None else \
            f"; without them CUDA {needed[0][0]}.{needed[0][1]} needs driver >= {needed[1]}"
        via = ",".join(str(c) for c in met[0])
        return Verdict(True, "forward compatibility",
                       f"{image} needs {wanted} ({source}) and {node_text}, but its alternative "
                       f"{via} holds: the image's CUDA compat libraries run on that driver "
                       f"branch (forward compatibility{without})")
    others = len(alternatives) - len(cuda_alts)
    unmatched = "" if others == 0 else \
        f" and none of its {others} other alternatives matches " \
        f"(brand {brand if brand is not None else 'not known'}, driver {driver})"
    if needed is None:
        advice = "change the driver or the image"
    else:
        release = f"{needed[0][0]}.{needed[0][1]}"
        target = f"the driver to >= {needed[1]}" if needed[1] else \
            f"to a driver that supports CUDA {release}"
        older = "an older CUDA" if node is None else f"CUDA {node[0]}.{node[1]}"
        advice = f"upgrade {target} or use an image built for {older}"
        minor = MINOR_COMPAT_DRIVER.get(needed[0][0])
        if minor and node is not None and node[0] == needed[0][0] \
                and _at_least(parse_version(driver), minor):
            advice += ("; NVIDIA_DISABLE_REQUIRE=true would start it under minor version "
                       "compatibility")
    return Verdict(False, "requirement",
                   f"{image} needs {wanted} ({source}) but {node_text}{unmatched}: the container "
                   f"toolkit refuses to start it; {advice}")


def _compatible(cuda: tuple[int, int], label: str, *, driver: str, node: tuple[int, int] | None,
                image: str) -> Verdict:
    """CUDA's own rules, when the container toolkit checks nothing."""
    release = f"{cuda[0]}.{cuda[1]}"
    driver_v = parse_version(driver)
    toolkit = TOOLKIT_DRIVER.get(cuda)
    minor = MINOR_COMPAT_DRIVER.get(cuda[0])
    node_text = _release(node)
    full = f">= {toolkit}" if toolkit else "a driver newer than NVIDIA's table here"
    if (toolkit and _at_least(driver_v, toolkit)) or (node is not None and node >= cuda):
        return Verdict(True, "toolkit driver",
                       f"{image} ({label}) runs on the node's driver {driver} ({node_text}): "
                       f"CUDA {release} needs driver {full}")
    if minor and node is not None and node[0] == cuda[0] and _at_least(driver_v, minor):
        return Verdict(True, "minor version compatibility",
                       f"{image} ({label}) runs on the node's driver {driver} ({node_text}) by "
                       f"minor version compatibility (CUDA {cuda[0]}.x needs driver >= {minor}, "
                       f"all of CUDA {release} needs {full}): features that need a newer driver "
                       f"and PTX JIT of PTX newer than {node_text} are unavailable")
    alternative = f", or >= {minor} under minor version compatibility" \
        if minor and minor != toolkit else ""
    older = "an older CUDA" if node is None else node_text
    return Verdict(False, "minor version compatibility" if minor else "toolkit driver",
                   f"{image} ({label}) cannot run on the node's driver {driver} ({node_text}): "
                   f"CUDA {release} needs driver {full}{alternative}; upgrade the driver or use "
                   f"an image built for {older}")


def judge(*, image_cuda: str | None, require: str | None, disable_require: bool, driver: str,
          driver_cuda_version: str | None, brand: str | None = None, arch: str | None = None,
          image: str = "the image") -> Verdict:
    """Whether an image (its ``CUDA_VERSION``, ``NVIDIA_REQUIRE_CUDA`` and
    ``NVIDIA_DISABLE_REQUIRE``) starts and runs on a node (its driver, the driver's CUDA as
    nvidia-smi shows it, else :func:`driver_cuda`, the GPU brand and compute capability).
    ``image`` names the image in the message as given. ValueError on a malformed version or
    expression."""
    parse_version(driver)
    node = _major_minor(driver_cuda_version) if driver_cuda_version else driver_cuda(driver)
    if not disable_require:
        if require:
            return _enforced(require, "NVIDIA_REQUIRE_CUDA", driver=driver, node=node,
                             brand=brand, arch=arch, image=image)
        if image_cuda:
            major, minor = _major_minor(image_cuda)
            return _enforced(f"cuda>={major}.{minor}", f"from CUDA_VERSION {image_cuda}",
                             driver=driver, node=node, brand=brand, arch=arch, image=image)
    else:
        if image_cuda:
            return _compatible(_major_minor(image_cuda), f"CUDA {image_cuda}", driver=driver,
                               node=node, image=image)
        if require:
            wanted = next((c for alt in _alternatives(require) for c in alt
                           if c.key == "cuda" and c.op in (">=", ">", "=")), None)
            if wanted is not None:
                return _compatible(_major_minor(wanted.value), f"NVIDIA_REQUIRE_CUDA {wanted}",
                                   driver=driver, node=node, image=image)
    return Verdict(True, "none", f"{image} declares no CUDA (CUDA_VERSION, NVIDIA_REQUIRE_CUDA)")
