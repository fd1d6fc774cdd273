"""image: the fleet's training image (``conformance --image IMAGE`` or ``container_image``)
on every node, in a container the node's engine (``container_engine``: docker or podman)
starts as the fleet's jobs start it: the image starts under the NVIDIA runtime; inside it,
every GPU of the node is visible; the image's CUDA runs on the node's driver (the rules of
NVIDIA's CUDA Compatibility guide and the container toolkit's NVIDIA_REQUIRE_CUDA check);
its NCCL and torch are the fleet's pins; /dev/shm is at least ``container_min_shm_gb``;
the node's RDMA devices and the shared mounts are there; and every node of a group holds
the same image (its ID, the digest of its configuration). The host's stack and the image's
are both reported. With an image, the allreduce, ddp and p2p probes run in it too.

Variables: container_image, container_engine, container_pull (missing),
container_run_options, container_mounts (the shared_mounts paths), container_rdma (true),
container_python (python3), container_min_shm_gb (1), container_timeout_s (300).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import roles
from gpufleet.conformance import container
from gpufleet.conformance.checks import image as image_checks
from gpufleet.conformance.checks.mounts import (
    declared,
    majority,
    mount_problems,
    mounted_at,
    parse_mountinfo,
)
from gpufleet.conformance.launch import run_script
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.image import ImageSettings
from gpufleet.errors import GpufleetError

GIB = 1 << 30


def _image(node: Node) -> str:
    reference = container.image(node)
    if reference is None:
        pytest.skip("no image: pass --image or set container_image")
    return reference


def _probe(node: Node) -> dict[str, Any]:
    """The image stack probe in a container of the image, then what the engine says of it."""
    reference = str(container.image(node))
    found: dict[str, Any] = {"image": reference, "engine": container.engine(node)}
    try:
        output = run_script(node, "image_stack", [], node.typed(ImageSettings).container_timeout_s,
                            in_image=True)
    except GpufleetError as exc:
        found["error"] = str(exc)
        return found
    stack = next((e for e in output.events if e.get("event") == "image_stack"), None)
    if output.rc != 0 or stack is None:
        found["error"] = (f"exit {output.rc}" + (f": {output.stderr_tail}"
                                                  if output.stderr_tail else ""))
    else:
        found["stack"] = stack
    try:
        inspected = node.run(container.inspect_command(node), timeout=60)
        found["info"] = container.parse_inspect(reference, inspected.check(
            f"{container.engine(node)} image inspect").stdout)
    except (GpufleetError, ValueError) as exc:
        found["info_error"] = str(exc)
    return found


def _stack(node: Node, conformance: ConformanceSession) -> dict[str, Any]:
    """The node's probe result (run once per node for every check)."""
    _image(node)
    return conformance.once(f"image:{node.name}", lambda: _probe(node))


def _started(node: Node, conformance: ConformanceSession) -> dict[str, Any]:
    """The image's stack inside the container; unknown when the image did not start."""
    found = _stack(node, conformance)
    if "stack" not in found:
        pytest.fail(f"unknown: image {found['image']} did not start (test_image_starts)")
    stack: dict[str, Any] = found["stack"]
    return stack


def _declarations(found: dict[str, Any]) -> dict[str, str]:
    """The image's environment as its configuration declares it (where NVIDIA's images
    declare CUDA_VERSION, NVIDIA_REQUIRE_CUDA and NCCL_VERSION), over what the probe saw."""
    info = found.get("info")
    return {**found["stack"].get("env", {}), **(info.env if info is not None else {})}


def test_image_starts(node: Node, conformance: ConformanceSession,
                      record_property: RecordProperty) -> None:
    found = _stack(node, conformance)
    host = roles.comparable(node.facts, node.host) if node.facts else {}
    stack = found.get("stack") or {}
    info = found.get("info")
    image_stack = {"python": stack.get("python"), "torch": (stack.get("torch") or {}),
                   "dpkg_nccl": stack.get("dpkg_nccl"), "env": stack.get("env"),
                   **({"id": info.id, "repo_digests": info.repo_digests} if info else {})}
    record_property("image", found["image"])
    record_property("host_stack", host)
    record_property("image_stack", image_stack)
    conformance.add_report("image", node.name, {"image": found["image"],
                                                "engine": found["engine"], "host": host,
                                                "image_stack": image_stack})
    assert "error" not in found, \
        f"image {found['image']} does not start with {found['engine']}: {found['error']}"
    assert "info_error" not in found or "error" in found, \
        f"image {found['image']}: {found['engine']} image inspect: {found['info_error']}"


def test_image_sees_every_gpu(node: Node, conformance: ConformanceSession,
                              record_property: RecordProperty) -> None:
    gpus = (node.facts.get("gpus") if node.facts else None) or []
    if not gpus:
        pytest.skip("the node has no GPUs")
    stack = _started(node, conformance)
    seen, missing = gpus_seen(stack, [str(g.get("uuid")) for g in gpus])
    record_property("gpus_in_image", seen)
    assert seen == len(gpus) and not missing, (
        f"image {container.image(node)}: the container sees {seen} of the node's "
        f"{len(gpus)} GPUs" + (f" (missing {', '.join(missing)})" if missing else "")
        + (f": {stack['gpus']['error']}" if stack["gpus"].get("error") else ""))


def gpus_seen(stack: dict[str, Any], uuids: list[str]) -> tuple[int, list[str]]:
    """How many GPUs the container sees (``nvidia-smi -L`` inside, else torch's count) and
    which of the node's ``uuids`` it lacks."""
    listed = stack["gpus"].get("uuids")
    if listed is None:
        return int((stack.get("torch") or {}).get("devices") or 0), []
    return len(listed), sorted(set(uuids) - set(listed))


def _driver(node: Node) -> str | None:
    facts = node.facts
    if facts is None:
        return None
    loaded = facts.get("nvidia_module")
    if loaded:
        return str(loaded)
    versions = {str(g.get("driver_version")) for g in facts.get("gpus") or []}
    return versions.pop() if len(versions) == 1 else None


def test_image_cuda_supported_by_driver(node: Node, conformance: ConformanceSession,
                                        record_property: RecordProperty) -> None:
    reference = _image(node)
    stack = _started(node, conformance)
    env = _declarations(_stack(node, conformance))
    cuda = env.get("CUDA_VERSION") or (stack.get("torch") or {}).get("cuda")
    require = env.get("NVIDIA_REQUIRE_CUDA")
    if not cuda and not require:
        pytest.skip(f"image {reference} declares no CUDA (CUDA_VERSION, NVIDIA_REQUIRE_CUDA) "
                    "and its torch is a CPU build")
    driver = _driver(node)
    if driver is None:
        pytest.fail(f"unknown: image {reference} needs CUDA {cuda or require} but the node's "
                    "driver is unknown (no NVIDIA kernel module loaded)")
    facts = node.facts
    try:
        verdict = image_checks.judge(
            image_cuda=cuda, require=require,
            disable_require=env.get("NVIDIA_DISABLE_REQUIRE", "").lower() in ("1", "true"),
            driver=driver, driver_cuda_version=facts.get("driver_cuda") if facts else None,
            brand=facts.get("gpu_brand") if facts else None, image=f"image {reference}")
    except ValueError as exc:
        pytest.fail(f"image {reference}: {exc}")
    record_property("image_cuda", cuda)
    record_property("driver", driver)
    record_property("rule", verdict.rule)
    assert verdict.ok, verdict.message


def image_nccl(stack: dict[str, Any], env: dict[str, str]) -> tuple[str, str] | None:
    """The NCCL the image's jobs use, and where it was read: torch's own, else the image's
    libnccl2 package, else the NCCL_VERSION its environment declares."""
    torch_nccl = (stack.get("torch") or {}).get("nccl")
    if torch_nccl:
        return str(torch_nccl), "torch.cuda.nccl.version()"
    if stack.get("dpkg_nccl"):
        return str(stack["dpkg_nccl"]).split("-", 1)[0], "libnccl2"
    if env.get("NCCL_VERSION"):
        return env["NCCL_VERSION"].split("-", 1)[0], "NCCL_VERSION"
    return None


def test_image_nccl_matches_pin(node: Node, conformance: ConformanceSession,
                                record_property: RecordProperty) -> None:
    reference = _image(node)
    pins = [(key, str(node.var(key))) for key in ("pytorch_nccl", "nccl_version")
            if node.var(key) is not None]
    if not pins:
        pytest.skip("the fleet pins no NCCL (nccl_version, pytorch_nccl)")
    stack = _started(node, conformance)
    found = image_nccl(stack, _declarations(_stack(node, conformance)))
    if found is None:
        pytest.fail(f"image {reference}: no NCCL found (torch, libnccl2, NCCL_VERSION); the "
                    f"fleet pins {pins[0][1]} ({pins[0][0]})")
    version, source = found
    record_property("image_nccl", version)
    key, pin = pins[0]
    assert version == pin.split("-", 1)[0], \
        f"image {reference}: NCCL {version} ({source}) but the fleet pins {pin} ({key})"


def test_image_torch_matches_pin(node: Node, conformance: ConformanceSession,
                                 record_property: RecordProperty) -> None:
    reference = _image(node)
    if node.var("pytorch_version") is None:
        pytest.skip("the fleet pins no torch (pytorch_version)")
    torch = _started(node, conformance).get("torch") or {}
    if "error" in torch:
        pytest.fail(f"image {reference}: torch does not import: {torch['error']}")
    record_property("image_torch", torch.get("version"))
    problems = roles.torch_pin_problems(
        {"torch": torch.get("version"), "cuda": torch.get("cuda"), "nccl": torch.get("nccl")},
        node.host)
    assert not problems, f"image {reference}: " + "; ".join(problems)


def test_image_shm(node: Node, conformance: ConformanceSession,
                   record_property: RecordProperty) -> None:
    reference = _image(node)
    size = _started(node, conformance).get("shm_bytes")
    minimum = node.typed(ImageSettings).container_min_shm_gb
    record_property("shm_gib", None if size is None else round(size / GIB, 3))
    assert size is not None, f"image {reference}: the container has no /dev/shm"
    assert size >= minimum * GIB, (
        f"image {reference}: /dev/shm is {size / GIB:.3g} GiB in the container, under "
        f"container_min_shm_gb {minimum:g} (give the engine --ipc=host or --shm-size in "
        "container_run_options)")


def test_image_rdma_devices(node: Node, conformance: ConformanceSession,
                            record_property: RecordProperty) -> None:
    rdma = (node.facts.get("rdma") if node.facts else None) or []
    if not rdma:
        pytest.skip("the node has no RDMA devices")
    reference = _image(node)
    inside = set(_started(node, conformance).get("rdma_devices") or [])
    record_property("rdma_in_image", sorted(inside))
    problems = []
    if not any(d.startswith("uverbs") for d in inside):
        problems.append("no /dev/infiniband/uverbs* device")
    if not node.typed(ImageSettings).container_rdma:
        problems.append("container_rdma is false")
    assert not problems, (f"image {reference}: the node has {len(rdma)} RDMA device(s) but "
                          "the container has " + "; ".join(problems))


def test_image_shared_mounts(node: Node, conformance: ConformanceSession,
                             record_property: RecordProperty) -> None:
    reference = _image(node)
    entries = declared(node.typed(ImageSettings).shared_mounts,
                       f"host {node.name}: shared_mounts")
    if not entries:
        pytest.skip("no shared_mounts declared")
    inside = parse_mountinfo(_started(node, conformance).get("mountinfo") or "")
    problems = []
    for entry in entries:
        sources = [m.source for other in conformance.ready()
                   if (m := mounted_at(other.known.get("mountinfo") or [],
                                       entry.path)) is not None]
        problems += mount_problems(entry, mounted_at(inside, entry.path), majority(sources))
    record_property("mounts_in_image", {e.path: (m.source if (m := mounted_at(
        inside, e.path)) else None) for e in entries})
    assert not problems, f"image {reference}: in the container, " + "; ".join(problems)


def test_image_agrees_within_each_group(node: Node, conformance: ConformanceSession,
                                        record_property: RecordProperty) -> None:
    reference = _image(node)
    info = _stack(node, conformance).get("info")
    if info is None:
        pytest.fail(f"unknown: image {reference} could not be inspected on this node")
    record_property("image_id", info.id)
    problems = []
    for group in sorted(node.host.groups - {"all"}) or ["all"]:
        held: dict[str, list[str]] = {}
        for other in conformance.ready():
            if group in other.host.groups and container.image(other):
                theirs = info if other is node else _stack(other, conformance).get("info")
                if theirs is not None:
                    held.setdefault(theirs.id, []).append(other.name)
        most = max(len(names) for names in held.values())
        leaders = [ident for ident, names in held.items() if len(names) == most]
        if leaders == [info.id] or len(held) == 1:
            continue
        others = ", ".join(f"{' '.join(names)} as {ident}" for ident, names in
                           sorted(held.items(), key=lambda item: -len(item[1]))
                           if ident != info.id)
        problems.append(f"group {group}: {node.name} runs {reference} as {info.id}; the "
                        f"group's other nodes run it {others}")
    assert not problems, "; ".join(problems)
