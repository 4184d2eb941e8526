"""Loading `ratchet.toml`: the schema (ratchet.core.config) validated with the plug-in
registries' catalogue, then each plug-in proposer's own table in a second pass.

This is the one place that knows both the schema and the registries: the schema is
imported by the registries (a backend's settings, a proposer's `Config`), so it cannot
import them back; the loader, above both, hands the registries to the schema as its
validation context.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ratchet import backends, proposers
from ratchet.core.config import (
    CONFIG_FILE,
    Config,
    ConfigError,
    SectionError,
    read_toml,
    section,
    validate,
)


class Registries:
    """The catalogue of the installed plug-ins (core.config.Catalogue), read from the
    registries: names without importing, a backend's settings model once it is loaded."""

    def backend_names(self) -> list[str]:
        return backends.names()

    def backends(self) -> Mapping[str, type[BaseModel]]:
        return {name: plugin.settings for name, plugin in backends.backends().items()}

    def proposer_kinds(self) -> list[str]:
        return list(proposers.proposer_kinds())


def parse_config(data: dict[str, Any], source: str = CONFIG_FILE) -> Config:
    return _plugin_pass(validate(data, source, Registries()), source)


def _plugin_pass(config: Config, source: str) -> Config:
    """The second pass: each plug-in proposer's table, validated by the settings model
    its class declares (loading that plug-in, and only it). A plug-in that failed to
    load was warned about; its table waits for the study that uses it."""
    if not config.tables:
        return config
    kinds = proposers.proposer_kinds()
    typed: dict[str, Any] = {}
    for name, raw in config.tables.items():
        cls = kinds[name].load()
        if cls is None:
            typed[name] = raw
            continue
        if cls.settings_model is None:
            raise ConfigError(f"{source}: {name}: the {name} proposer reads no table of its "
                              f"own; remove [{name}]")
        try:
            typed[name] = section(cls.settings_model, raw, name, "docs/proposers.md")
        except SectionError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return config.model_copy(update={"tables": typed})


def load_config(repo: Path) -> Config:
    path = Path(repo) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not found (run `ratchet init` to create one)")
    return loads_config(path.read_bytes(), str(path))


def loads_config(raw: bytes, source: str = CONFIG_FILE) -> Config:
    return parse_config(read_toml(raw, source), source)
