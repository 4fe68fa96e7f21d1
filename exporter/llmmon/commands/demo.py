"""`llmmon demo`: a simulated cluster with Prometheus and Alertmanager on the shipped rules."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from llmmon.commands.simulate import add_cluster_arguments, cluster_config, specs, \
    stop_on_signals, work_dir

if TYPE_CHECKING:
    from llmmon.simulate.stack import Notification

GRAFANA_IMAGE = "grafana/grafana:11.2.0"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo", help="A simulated cluster, Prometheus and Alertmanager with the shipped rules.",
        description="Start simulated nodes (as `llmmon simulate`), and, where the Debian "
        "`prometheus` and `prometheus-alertmanager` binaries are installed, a Prometheus that "
        "scrapes them with alerts/rules/ and an Alertmanager with alerts/alertmanager.yaml "
        "whose receivers print here. Prints the URLs and a Grafana provisioning directory. "
        "Ctrl-C stops everything.")
    add_cluster_arguments(parser)
    parser.set_defaults(nodes=2, port=0)
    parser.add_argument("--for", dest="for_override", metavar="DURATION",
                        help="render the rules with every `for:` set to DURATION (e.g. 30s) and "
                             "shorten Alertmanager's grouping waits, so alerts come in minutes")
    parser.add_argument("--scrape-interval", default="5s", metavar="DURATION",
                        help="Prometheus scrape and rule evaluation interval (default 5s)")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="stop after this many wall seconds (default: until Ctrl-C)")
    parser.set_defaults(func=run)


def _print_notification(note: Notification) -> None:
    for alert in note.payload.get("alerts", []):
        labels = alert["labels"]
        where = " ".join(f"{k}={labels[k]}" for k in ("node", "job_id", "rank", "gpu", "netdev",
                                                       "device") if k in labels)
        print(f"[{note.receiver}] {alert['status']}: {labels.get('alertname')} "
              f"({labels.get('severity')}) {where}", flush=True)


def grafana_provisioning(work: Path, prometheus: str, interval: str) -> Path:
    """Data source and dashboard provider files for a local Grafana."""
    from llmmon.simulate.stack import DASHBOARDS

    root = work / "grafana"
    shipped = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml")
                             .read_text(encoding="utf-8"))
    for source in shipped["datasources"]:
        source["url"] = prometheus
        source.setdefault("jsonData", {})["timeInterval"] = interval
    provider = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "llmmon.yaml")
                              .read_text(encoding="utf-8"))
    for entry in provider["providers"]:
        entry["options"]["path"] = str(DASHBOARDS)
    for name, doc in (("datasources", shipped), ("dashboards", provider)):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "llmmon.yaml").write_text(yaml.safe_dump(doc, sort_keys=False),
                                                 encoding="utf-8")
    return root


def run(args: argparse.Namespace) -> int:
    from llmmon import logs
    from llmmon.simulate import stack
    from llmmon.simulate.runner import Simulation

    logs.setup("warning", "logfmt")
    servers: list[stack.ServiceProcess] = []
    receiver = None
    with work_dir(args.dir) as root, stop_on_signals() as stop:
        try:
            simulation = Simulation(root / "sim", cluster_config(args), specs(args))
        except ValueError as exc:
            print(f"llmmon demo: {exc}", file=sys.stderr)
            return 2
        try:
            simulation.serve(args.host, args.port, args.serve_arg)
            active = ", ".join(a.spec.text for a in simulation.cluster.active) or "healthy"
            lines = [f"simulated nodes ({active}):"]
            lines += [f"  {e.node.name}  {e.url}/metrics" for e in simulation.exporters]
            lines.append(f"switch scenarios: echo 'hang@sim-00' > {simulation.control.path}")
            prometheus_bin = stack.find_binary("prometheus")
            alertmanager_bin = stack.find_binary("alertmanager", "prometheus-alertmanager")
            alertmanager = None
            if alertmanager_bin:
                receiver = stack.WebhookReceiver(on_notify=_print_notification)
                fast = args.for_override is not None
                alertmanager = stack.start_alertmanager(
                    alertmanager_bin, root / "alertmanager", stack.alertmanager_config(
                        receiver.url, *(("5s", "30s") if fast else (None, None))))
                servers.append(alertmanager)
                lines.append(f"Alertmanager: {alertmanager.url} (receivers print here)")
            else:
                lines.append("Alertmanager: not installed (apt-get install "
                             "prometheus-alertmanager)")
            if prometheus_bin:
                prometheus = stack.start_prometheus(prometheus_bin, root / "prometheus",
                                                    stack.prometheus_config(
                    simulation.targets_file, stack.rules_dir(root, args.for_override),
                    alertmanager.url.removeprefix("http://") if alertmanager else None,
                    args.scrape_interval))
                servers.append(prometheus)
                grafana = grafana_provisioning(root, prometheus.url, args.scrape_interval)
                lines += [f"Prometheus: {prometheus.url}  (alerts: {prometheus.url}/alerts)",
                          f"Grafana: provision from {grafana}, e.g.",
                          f"  docker run --rm --network host -v {grafana}:/etc/grafana/"
                          f"provisioning -v {stack.DASHBOARDS}:{stack.DASHBOARDS} "
                          f"{GRAFANA_IMAGE}",
                          "  then open http://127.0.0.1:3000 (admin/admin), folder llmmon"]
            else:
                lines.append("Prometheus: not installed (apt-get install prometheus); scrape "
                             f"the nodes with file_sd from {simulation.targets_file}")
            lines.append("Ctrl-C stops everything.")
            (root / "servers.json").write_text(json.dumps(
                [{"name": s.name, "url": s.url, "pid": s.process.pid} for s in servers]))
            print("\n".join(lines), flush=True)
            simulation.run(stop, args.duration)
        except (RuntimeError, stack.StackError) as exc:
            print(f"llmmon demo: {exc}", file=sys.stderr)
            return 1
        finally:
            for server in reversed(servers):
                server.stop()
            if receiver is not None:
                receiver.close()
            simulation.close()
    return 0
