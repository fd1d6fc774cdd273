"""The stack's versions on each node, for the acceptance report: from the stack and image
suites, the AllReduce probe, bootstrap's mark step and the nodes' recorded states."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.report.html.conformance import results_of
from gpufleet.report.html.page import dicts, fold, list_of, mapping


def stack_versions(merged: Mapping[str, Any], bootstrap: Sequence[Mapping[str, Any]],
              nodes: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per key of the stack (kernel, driver, cuda, nccl, torch ...), each value and the
    hosts that have it (folded)."""
    per_host: dict[str, dict[str, str]] = {}
    for host, values in mapping(mapping(mapping(merged.get("data")).get("stack"))
                                 .get("versions")).items():
        per_host[str(host)] = {str(k): str(v) for k, v in mapping(values).items()}
    states = [*nodes, *(mapping(mapping(s.get("data")).get("state")) for b in bootstrap
                        for s in dicts(b.get("steps")) if s.get("step") == "mark")]
    for state in states:
        if state.get("host"):
            per_host.setdefault(str(state["host"]), {}).update(
                {str(k): str(v) for k, v in mapping(state.get("versions")).items()})
    for name, run in mapping(mapping(merged.get("data")).get("allreduce")).items():
        summary = mapping(mapping(run).get("summary"))
        if name.startswith("single ") and summary:
            found = {f"{k} (AllReduce probe)": str(summary[k]) for k in ("torch", "cuda", "nccl")
                     if summary.get(k)}
            devices = Counter(map(str, list_of(summary.get("devices"))))
            found.update({"GPUs (AllReduce probe)": ", ".join(f"{n}x {d}" for d, n in
                                                              devices.items())} if devices else {})
            per_host.setdefault(name.removeprefix("single "), {}).update(found)
    for host, entry in mapping(mapping(merged.get("data")).get("image")).items():
        per_host.setdefault(str(host), {}).update(_image_versions(mapping(entry)))
    for r in results_of(merged):
        if r.suite == "stack" and r.check == "test_torch_imports":
            per_host.setdefault(r.host, {}).update(
                {f"{k} (imported)": str(v) for k, v in r.properties.items() if v is not None})
    keys: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for host, values in per_host.items():
        for key, value in values.items():
            keys[key][value].append(host)
    return [(key, [(value, fold(hosts)) for value, hosts in
                   sorted(values.items(), key=lambda kv: -len(kv[1]))])
            for key, values in sorted(keys.items())]


def _image_versions(entry: Mapping[str, Any]) -> dict[str, str]:
    """The training image's stack on one node, as the image suite reported it."""
    stack = mapping(entry.get("image_stack"))
    torch = mapping(stack.get("torch"))
    env = mapping(stack.get("env"))
    found = {"image": entry.get("image"), "image ID": str(stack.get("id") or "")[:19] or None,
             "python (image)": stack.get("python"), "torch (image)": torch.get("version"),
             "cuda (image)": env.get("CUDA_VERSION") or torch.get("cuda"),
             "nccl (image)": torch.get("nccl") or stack.get("dpkg_nccl")
             or env.get("NCCL_VERSION")}
    return {k: str(v) for k, v in found.items() if v}
