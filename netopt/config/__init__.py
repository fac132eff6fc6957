"""Configuration: one loader for every netopt YAML file.

``load_settings(path, kind)`` reads a YAML file, applies ``NETOPT_*``
environment overrides and returns frozen, typed settings. Kinds:

========== ===================== ===========================
kind       settings class        example file
========== ===================== ===========================
agent      AgentSettings         configs/agent.yaml
coordinator CoordinatorSettings  configs/coordinator.yaml
datasets   DatasetsSettings      configs/datasets.yaml
lab        LabTopology           configs/lab/two-region.yaml
links      LinksSettings         configs/links-example.yaml
========== ===================== ===========================

Environment overrides: ``NETOPT_<KIND>__<KEY>[__<SUBKEY>...]=VALUE`` sets a key
of an agent or coordinator file (the value is read as a YAML scalar, so
``NETOPT_AGENT__PROBE__RATE_PPS=50`` gives a number), and ``NETOPT_TOKEN`` sets
the shared token of both (taking the place of ``token``/``token_file``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

from netopt.config.common import ListenAddress, TlsSettings
from netopt.config.datasets import DatasetSpec, DatasetsSettings
from netopt.config.lab import LabTopology, LinkShape, LinkSpec, RegionSpec
from netopt.config.links import LinkPairSpec, LinksSettings, NicSpec, NodeLinksSpec
from netopt.config.loader import SourceMap, convert, parse_yaml
from netopt.config.services import (
    AgentSettings,
    CacheSettings,
    CoordinatorSettings,
    ProbePlanSettings,
    ProbeSettings,
    SpoolSettings,
)
from netopt.errors import ConfigError
from netopt.tokens import TOKEN_ENV, cli_token, resolve_token

__all__ = [
    "KINDS",
    "AgentSettings",
    "CacheSettings",
    "CoordinatorSettings",
    "DatasetSpec",
    "DatasetsSettings",
    "Kind",
    "LabTopology",
    "LinkPairSpec",
    "LinkShape",
    "LinkSpec",
    "LinksSettings",
    "ListenAddress",
    "NicSpec",
    "NodeLinksSpec",
    "ProbePlanSettings",
    "ProbeSettings",
    "RegionSpec",
    "Settings",
    "SpoolSettings",
    "TlsSettings",
    "cli_token",
    "detect_kind",
    "load_settings",
    "parse_settings",
    "resolve_token",
    "settings_from_data",
    "settings_to_dict",
]

Kind = Literal["agent", "coordinator", "datasets", "lab", "links"]
Settings = AgentSettings | CoordinatorSettings | DatasetsSettings | LabTopology | LinksSettings
KINDS: dict[str, type[Any]] = {
    "agent": AgentSettings,
    "coordinator": CoordinatorSettings,
    "datasets": DatasetsSettings,
    "lab": LabTopology,
    "links": LinksSettings,
}
_OVERRIDABLE = ("agent", "coordinator")

S = TypeVar("S")


def detect_kind(data: Any, file: str) -> Kind:
    """Tell the kind of a parsed file from its ``kind:`` key or its distinctive keys."""
    if isinstance(data, dict):
        declared = data.get("kind")
        if declared is not None:
            if declared not in KINDS:
                raise ConfigError(
                    f"is {declared!r}", file=file, key_path="kind", expected=" or ".join(KINDS)
                )
            return cast(Kind, declared)
        if "regions" in data:
            return "lab"
        if "nodes" in data and "links" in data:
            return "links"
        if "datasets" in data:
            return "datasets"
        if "node" in data:
            return "agent"
        if "database" in data or "probe_plan" in data:
            return "coordinator"
    raise ConfigError(
        "cannot tell what kind of netopt file this is",
        file=file,
        expected="a 'kind:' key or --kind agent|coordinator|datasets|lab|links",
    )


@overload
def load_settings(
    path: str | os.PathLike[str], kind: Literal["agent"], env: Mapping[str, str] | None = None
) -> AgentSettings: ...
@overload
def load_settings(
    path: str | os.PathLike[str],
    kind: Literal["coordinator"],
    env: Mapping[str, str] | None = None,
) -> CoordinatorSettings: ...
@overload
def load_settings(
    path: str | os.PathLike[str], kind: Literal["datasets"], env: Mapping[str, str] | None = None
) -> DatasetsSettings: ...
@overload
def load_settings(
    path: str | os.PathLike[str], kind: Literal["lab"], env: Mapping[str, str] | None = None
) -> LabTopology: ...
@overload
def load_settings(
    path: str | os.PathLike[str], kind: Literal["links"], env: Mapping[str, str] | None = None
) -> LinksSettings: ...
@overload
def load_settings(
    path: str | os.PathLike[str], kind: None = None, env: Mapping[str, str] | None = None
) -> Settings: ...
def load_settings(
    path: str | os.PathLike[str], kind: Kind | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Read ``path`` and return its settings.

    ``env`` defaults to ``os.environ``. Raises ConfigError (file, key, expectation,
    line) for a missing, unreadable or invalid file.
    """
    file = os.fspath(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("does not exist", file=file, expected="a readable YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot be read: {exc}", file=file) from None
    return parse_settings(text, file, kind, os.environ if env is None else env)


def parse_settings(
    text: str, file: str, kind: Kind | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Parse settings from YAML ``text``; ``file`` names it in errors."""
    data, source = parse_yaml(text, file)
    return settings_from_data(data, source, kind, env)


def settings_from_data(
    data: Any, source: SourceMap, kind: Kind | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Settings from a parsed document: a YAML file's, or one built in memory (such as
    the links document of a coordinator's answers); ``source.file`` names it in errors."""
    file = source.file
    if data == {} and kind is None:
        raise ConfigError("is empty", file=file, expected="a YAML mapping")
    if not isinstance(data, dict):
        raise ConfigError("is not a mapping", file=file, line=1, expected="a YAML mapping")
    found = detect_kind(data, file) if kind is None else kind
    declared = data.pop("kind", None)
    if declared is not None and declared != found:
        raise ConfigError(
            f"is {declared!r} but the file is read as {found!r}",
            file=file,
            key_path="kind",
            line=source.line_of(("kind",)),
            expected=found,
        )
    if found in _OVERRIDABLE and env:
        data, source = _apply_overrides(data, source, found, env)
    settings = convert(KINDS[found], data, source)
    if found in _OVERRIDABLE and env and env.get(TOKEN_ENV):
        settings = replace(settings, token=env[TOKEN_ENV], token_file=None)
    return cast(Settings, settings)


def _apply_overrides(
    data: dict[str, Any], source: SourceMap, kind: str, env: Mapping[str, str]
) -> tuple[dict[str, Any], SourceMap]:
    import yaml  # here: a command that reads no settings file never loads it

    prefix = f"NETOPT_{kind.upper()}__"
    lines = dict(source.lines)
    for name in sorted(env):
        if not name.startswith(prefix):
            continue
        keys = [k.lower() for k in name[len(prefix) :].split("__")]
        if not all(keys):
            raise ConfigError(
                "has an empty key", file=f"environment {name}", expected=f"{prefix}KEY[__SUBKEY]"
            )
        try:
            value = yaml.safe_load(env[name])
        except yaml.YAMLError:
            value = env[name]
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[keys[-1]] = value
        lines.pop(tuple(keys), None)
    return data, SourceMap(source.file, lines)


SECRET_KEYS = frozenset({"token", "password", "secret", "secret_access_key"})
"""Settings fields whose values are secrets: ``settings_to_dict`` shows them as hidden."""
HIDDEN = "(hidden)"


def settings_to_dict(settings: Any, *, redact: bool = True) -> Any:
    """Settings as plain JSON-able data (mappings, lists, scalars).

    With ``redact`` (the default), a secret field that is set reads ``"(hidden)"``: what
    this returns is for printing, and no secret is ever printed.
    """
    if hasattr(settings, "__dataclass_fields__"):
        out = {}
        for name in settings.__dataclass_fields__:
            value = getattr(settings, name)
            if redact and name in SECRET_KEYS and value is not None:
                out[name] = HIDDEN
            else:
                out[name] = settings_to_dict(value, redact=redact)
        return out
    if isinstance(settings, Mapping):
        return {str(k): settings_to_dict(v, redact=redact) for k, v in settings.items()}
    if isinstance(settings, tuple | list):
        return [settings_to_dict(v, redact=redact) for v in settings]
    return settings
