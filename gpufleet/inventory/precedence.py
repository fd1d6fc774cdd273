"""Variable precedence: layers merged key by key, the later winning, each value remembering
where it is set; the group variables a combination of groups shares, merged once, under a
host's own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufleet.inventory.secrets import holds_secret, remember_secret
from gpufleet.inventory.templating import Fleet, HostVars, SharedRenders, needs_render


def merge_layers(layers: Iterable[tuple[Mapping[str, Any], Mapping[str, str]]]
                 ) -> tuple[dict[str, Any], dict[str, str]]:
    """Values merged key by key, later layers winning, with where each winner is set (every
    layer's origins name exactly its own keys)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer_values, layer_origins in layers:
        values.update(layer_values)
        origins.update(layer_origins)
    return values, origins


class Layer:
    """The group variables every host of one combination of groups shares, merged once:
    which of them are secrets and which need rendering is worked out once too, and a
    template that none of its hosts' own variables reach is rendered once for them all."""

    def __init__(self, values: dict[str, Any], origins: dict[str, str]) -> None:
        self.values = values
        self.origins = origins
        self.secrets = [key for key, value in values.items() if holds_secret(key, value)]
        self.templated = {key for key, value in values.items() if needs_render(value)}
        self.renders = SharedRenders(values)

    def host_vars(self, name: str, declared: tuple[dict[str, Any], dict[str, str]],
                  files: tuple[dict[str, Any], dict[str, str]], fleet: Fleet,
                  group_names: list[str], *, source: str | None) -> HostVars:
        """A host's variables: these, then its own declared in inventory files (``source``:
        the file that named it first), then its host_vars/ files. The values stay shared;
        HostVars copies a list or mapping when it is read."""
        values, origins = dict(self.values), dict(self.origins)
        values.update(declared[0])
        origins.update(declared[1])
        values.update(files[0])
        origins.update(files[1])
        own = declared[0].keys() | files[0].keys()
        for key in (*self.secrets, *own):
            remember_secret(key, values[key])
        templated = (self.templated - own) | {key for key in own if needs_render(values[key])}
        return HostVars(name, values, origins, templated, shared=self.renders, own=own,
                        fleet=fleet, source=source, group_names=group_names)
