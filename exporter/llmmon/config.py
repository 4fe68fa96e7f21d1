"""Settings for `llmmon serve`: defaults, then the YAML config file, then command-line flags.

Every setting is an `Option`; flags are generated from the same table as the YAML keys, so a
setting documented in `--help` is always accepted in the file and the other way round.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import yaml

from llmmon.collector import Collector
from llmmon.options import Option

GLOBAL_OPTIONS: tuple[Option, ...] = (
    Option("web.listen_address", "str", ":9476",
           "Address to listen on: host:port, :port for all interfaces, [::]:port for IPv6. "
           "9476 avoids node_exporter (9100), dcgm-exporter (9400) and "
           "nvidia_gpu_exporter (9835).", metavar="ADDRESS"),
    Option("web.telemetry_path", "str", "/metrics", "Path under which to expose metrics.",
           metavar="URL_PATH"),
    Option("web.config_file", "str", "",
           "Exporter-toolkit web config (TLS, client certificates, basic auth); "
           "empty serves plain HTTP. See docs/security.md.", flag="--web.config.file",
           metavar="FILE"),
    Option("web.max_connections", "int", 256,
           "Most connections open at once, TLS handshakes included; at the limit the "
           "connection idle longest is closed for a new one. Lowered at start to keep 128 "
           "file descriptors below the open-file limit for the collectors.",
           minimum=1, maximum=65536),
    Option("web.read_timeout", "duration", "10s",
           "Time a client has to send a whole request, headers and body, from its first byte "
           "(from the accept, TLS handshake included, for a connection's first request).",
           minimum="100ms", maximum="1h"),
    Option("web.idle_timeout", "duration", "60s",
           "How long an idle keep-alive connection is kept open between requests.",
           minimum="1s", maximum="24h"),
    Option("web.shutdown_grace", "duration", "5s",
           "On SIGTERM or SIGINT, how long requests in progress may take before their "
           "connections are closed and the daemon exits.", minimum="100ms", maximum="10m"),
    Option("path.sysfs", "str", "/sys", "sysfs mount point (a host's /sys mounted elsewhere "
           "in a container, or a fixture tree).", metavar="DIR"),
    Option("path.procfs", "str", "/proc", "procfs mount point.", metavar="DIR"),
    Option("log.level", "str", "info", "Log level: debug, info, warning or error.", metavar="LEVEL"),
    Option("log.format", "str", "logfmt", "Log format: logfmt or json.", metavar="FORMAT"),
    Option("nvml.replay", "str", "",
           "Replay NVML from a snapshot file, or a directory of them (one GPU per file, in "
           "name order), instead of the real library; every collector that names GPUs uses "
           "it. See docs/gpu.md.", flag="--fake-nvml", metavar="PATH"),
    Option("sampler.max_staleness", "duration", "60s",
           "How long a failing or hung collector's last good snapshot is still served.",
           minimum="1s", maximum="24h"),
    Option("sampler.format_idle", "duration", "5m",
           "How long an exposition format (text or OpenMetrics) is still rendered after the "
           "last scrape that asked for it. A node scraped in one format renders only that "
           "one, half the rendering CPU; the first scrape in another format waits for it to "
           "be rendered (tens of milliseconds on a fat node).", minimum="1s", maximum="24h"),
    Option("sampler.series_budget", "int", 2000,
           "Series this node may expose (docs/capacity.md: 2,000 for 8 GPUs, 8 RDMA ports, 16 "
           "disks and 8 ranks at the default flags). Above it "
           "llmmon_exporter_series_budget_exceeded is 1 and a warning names the largest "
           "collector; nothing is dropped. 0: no budget.", minimum=0, maximum=10_000_000),
    Option("sampler.max_rss_mib", "int", 160,
           "Resident memory (MiB) the collector process may use; past it the process is "
           "killed and started again, the last snapshot served meanwhile. The HTTP server "
           "is a process of its own, so this never stops /metrics answering.",
           minimum=16, maximum=1_048_576),
)
COMMON_COLLECTOR_OPTIONS = ("enabled", "interval", "timeout")


class ConfigError(Exception):
    """A bad flag value or config file, with the key it concerns."""


def flag_for(key: str) -> str:
    return "--" + key.replace("_", "-")


def global_flag(option: Option) -> str:
    return option.flag or flag_for(option.key)


def collector_options(cls: type[Collector]) -> tuple[Option, ...]:
    """The common options (enabled, interval, timeout) followed by the collector's own."""
    prefix = f"collector.{cls.name}"
    return (
        Option("enabled", "bool", cls.enabled_by_default,
               f"Enable the {cls.name} collector: {cls.description}",
               flag=f"--{prefix}"),
        Option("interval", "duration", cls.interval,
               f"How often the {cls.name} collector runs.", minimum="100ms", maximum="24h"),
        Option("timeout", "duration", cls.timeout,
               f"After this long a {cls.name} run counts as failed (it may still be blocked).",
               minimum="1ms", maximum="1h"),
    ) + cls.options


def collector_flag(cls: type[Collector], option: Option) -> str:
    return option.flag or flag_for(f"collector.{cls.name}.{option.key}")


@dataclass
class Settings:
    values: dict[str, Any]
    collectors: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def _help(option: Option) -> str:
    bounds = f"; {option.range}" if option.range else ""
    return f"{option.help} (default: {option.default_text()}{bounds})"


def add_serve_arguments(parser: argparse.ArgumentParser, classes: list[type[Collector]],
                        web: bool = True) -> None:
    """Flags for every option; defaults stay None so only given flags override the file.
    `web=False` leaves out the HTTP server's flags for commands that serve nothing (their
    config file may still hold a `web` section)."""
    parser.add_argument("--config.file", dest="config_file", metavar="PATH",
                        help="YAML file with any of the settings below (flags win).")
    parser.add_argument("--collector.disable-defaults", dest="disable_defaults",
                        action="store_true", default=None,
                        help="Disable every collector not enabled explicitly.")
    for option in GLOBAL_OPTIONS:
        if web or not option.key.startswith("web."):
            parser.add_argument(global_flag(option), dest=f"g:{option.key}",
                                metavar=option.placeholder,
                                help=_help(option))
    for cls in classes:
        group = parser.add_argument_group(f"collector {cls.name}", cls.description)
        for option in collector_options(cls):
            dest = f"c:{cls.name}:{option.key}"
            if option.key == "enabled":
                group.add_argument(collector_flag(cls, option), dest=dest,
                                   action="store_const", const=True,
                                   help=_help(option))
                group.add_argument(f"--no-collector.{cls.name}", dest=dest,
                                   action="store_const", const=False,
                                   help=f"Disable the {cls.name} collector.")
            else:
                group.add_argument(collector_flag(cls, option), dest=dest,
                                   metavar=option.placeholder,
                                   help=_help(option))


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return data


def _section(data: Any, where: str) -> dict[str, Any]:
    if data is None:  # a key with nothing under it, as YAML users write while editing
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data


def _parse(option: Option, value: Any, where: str) -> Any:
    try:
        return option.parse(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _choose(option: Option, flag_value: Any, flag: str, file_values: dict[str, Any],
            where: str, default: Any) -> Any:
    """The flag's value, else the file's, else `default`.  The file's value is checked even
    when a flag overrides it: a bad file fails now, not on the day someone drops the flag."""
    key = option.key.rpartition(".")[2]
    from_file = _parse(option, file_values[key], where) if key in file_values else None
    if flag_value is not None:
        return _parse(option, flag_value, flag)
    return from_file if key in file_values else default


def build_settings(args: argparse.Namespace, classes: list[type[Collector]]) -> Settings:
    """Merge defaults, the YAML file and the flags into validated settings."""
    data = _load_yaml(args.config_file) if getattr(args, "config_file", None) else {}
    given = vars(args)
    known_sections = {o.key.split(".")[0] for o in GLOBAL_OPTIONS} | {"collectors"}
    for section in data:
        if section not in known_sections:
            raise ConfigError(f"config: unknown section {section!r}; "
                              f"known: {', '.join(sorted(known_sections))}")
    values: dict[str, Any] = {}
    for option in GLOBAL_OPTIONS:
        section, key = option.key.split(".")
        file_section = _section(data.get(section, {}), section)
        values[option.key] = _choose(option, given.get(f"g:{option.key}"), global_flag(option),
                                     file_section, option.key, option.parse(option.default))
    for section in known_sections - {"collectors"}:
        keys = {o.key.split(".")[1] for o in GLOBAL_OPTIONS if o.key.startswith(section + ".")}
        unknown = set(_section(data.get(section, {}), section)) - keys
        if unknown:
            raise ConfigError(f"config: unknown key(s) in {section}: {', '.join(sorted(unknown))}")

    file_collectors = _section(data.get("collectors", {}), "collectors")
    names = {cls.name for cls in classes}
    for name in file_collectors:
        if name not in names:
            raise ConfigError(f"config: unknown collector {name!r}; "
                              f"known: {', '.join(sorted(names))}")
    settings = Settings(values)
    for cls in classes:
        file_values = _section(file_collectors.get(cls.name) or {}, f"collectors.{cls.name}")
        options = collector_options(cls)
        unknown = set(file_values) - {o.key for o in options}
        if unknown:
            raise ConfigError(f"config: unknown key(s) for collector {cls.name}: "
                              f"{', '.join(sorted(unknown))}")
        config: dict[str, Any] = {}
        for option in options:
            default = (False if option.key == "enabled" and given.get("disable_defaults")
                       else option.parse(option.default))
            config[option.key] = _choose(option, given.get(f"c:{cls.name}:{option.key}"),
                                         collector_flag(cls, option), file_values,
                                         f"collectors.{cls.name}.{option.key}", default)
        settings.collectors[cls.name] = config
    return settings
