"""This node's settings for a client command (``sync``, ``cache ...``), resolved once.

A command on a node takes its cache, region, coordinator and transfer defaults from
its options and, with ``--config AGENT.yaml``, from the node's agent config: an
option given wins over the file's key. `resolve_node` reads the file once and
returns a frozen `NodeSettings`; the commands read that, never the file again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from netopt.cachepaths import default_cache_dir
from netopt.config import load_settings, resolve_token
from netopt.config.datasets import DatasetsSettings
from netopt.config.loader import parse_byte_size
from netopt.config.services import AgentSettings
from netopt.errors import ValidationError

__all__ = ["DEFAULT_MAX_STREAMS", "NodeSettings", "default_cache_dir", "resolve_node"]

DEFAULT_MAX_STREAMS = 64
"""The most parallel connections a sync may open without an agent config to bound it."""


@dataclass(frozen=True)
class NodeSettings:
    """What a client command on this node works with; options won over the agent config.

    ``config_file`` is the agent config read (None: none was given). The transfer
    defaults (``rate_limit_mbps``, ``max_parallel_streams``, ``congestion_control``)
    are the config's ``cache.*`` keys, or none (64 streams) without a config.
    """

    config_file: str | None
    cache_dir: str
    capacity_bytes: int | None
    region: str | None
    coordinator_url: str | None
    node: str | None
    token: str | None
    catalogue: DatasetsSettings | None = None
    rate_limit_mbps: float | None = None
    max_parallel_streams: int = DEFAULT_MAX_STREAMS
    congestion_control: str | None = None


_READ: dict[tuple[object, ...], AgentSettings] = {}


def agent_settings(config_file: str) -> AgentSettings:
    """The agent config ``config_file``, read once per process however many parts of a
    command ask (the TLS options, `resolve_node`): read again only if the file or the
    ``NETOPT_AGENT__*`` overrides changed. ConfigError as `load_settings`."""
    try:
        st = os.stat(config_file)
        key: tuple[object, ...] = (
            os.path.realpath(config_file), st.st_mtime_ns, st.st_size, st.st_ino,
            tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("NETOPT_"))),
        )  # fmt: skip
    except OSError:
        return load_settings(config_file, "agent")  # names the file and the reason
    if key not in _READ:
        _READ.clear()
        _READ[key] = load_settings(config_file, "agent")
    return _READ[key]


def resolve_node(
    config_file: str | None,
    *,
    cache_dir: str | None = None,
    capacity: str | None = None,
    region: str | None = None,
    coordinator_url: str | None = None,
    node: str | None = None,
    token: str | None = None,
    datasets_file: str | None = None,
    agent_token: bool = False,
) -> NodeSettings:
    """Merge the options with the agent config ``config_file`` (read once) and the
    datasets catalogue ``datasets_file``.

    ``capacity`` is a size such as ``50GiB``. ``token`` is the command line's token;
    without it and with ``agent_token``, the agent config's ``token`` / ``token_file``
    (when it sets one) gives it. Raises ConfigError for a bad or unreadable file or
    token file, ValidationError for a bad ``capacity``.
    """
    capacity_bytes: int | None = None
    if capacity is not None:
        try:
            capacity_bytes = parse_byte_size(capacity if not capacity.isdigit() else int(capacity))
        except ValueError:
            raise ValidationError(f"--capacity {capacity!r}: expected a size like 50GiB") from None
    if config_file is None:
        catalogue = load_settings(datasets_file, "datasets") if datasets_file else None
        return NodeSettings(
            None, cache_dir or default_cache_dir(), capacity_bytes, region, coordinator_url,
            node, token, catalogue,
        )  # fmt: skip
    agent = agent_settings(config_file)
    if token is None and agent_token and (agent.token or agent.token_file):
        token = resolve_token(agent.token, agent.token_file)
    catalogue = load_settings(datasets_file, "datasets") if datasets_file else None
    return NodeSettings(
        config_file=config_file,
        cache_dir=cache_dir or agent.cache.dir,
        capacity_bytes=capacity_bytes or agent.cache.capacity_bytes,
        region=region or agent.region,
        coordinator_url=coordinator_url or agent.coordinator_url,
        node=node or agent.node,
        token=token,
        catalogue=catalogue,
        rate_limit_mbps=agent.cache.rate_limit_mbps,
        max_parallel_streams=agent.cache.max_parallel_streams,
        congestion_control=agent.cache.congestion_control,
    )
