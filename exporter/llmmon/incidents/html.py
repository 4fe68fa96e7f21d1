"""The pages' common parts: one look (inline CSS), escaping, tables, sections that survive bad
content, and the list of incidents.

Every page is a self-contained document (inline CSS, no script, no external asset) rendered by
the server process, so that it reads in a browser while Prometheus, Grafana or the collector
process are down, and from a saved copy off the node. Job ids, frames and kernel lines are
anybody's text: every value goes through `esc`.
"""

from __future__ import annotations

import html
import time
from typing import Any, Callable

from llmmon.incidents.store import Listing
from llmmon.ranks.spans import spans_text
from llmmon.textsafe import printable

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em 2em;color:#1d1d1f;line-height:1.35}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;
border-bottom:1px solid #ddd}h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;margin:.3em 0}td,th{padding:.2em .7em;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}th{background:#f4f4f6}
td,th,p,li,dd{overflow-wrap:break-word}pre{overflow-wrap:anywhere}.nowrap{white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}
pre{white-space:pre-wrap;background:#f7f7f9;padding:.5em;margin:.2em 0;font-size:.85em}
.culprit{background:#fdecea;border-left:5px solid #b00020;padding:.6em 1em;margin:.6em 0}
.culprit strong{color:#b00020}.group{border:1px solid #ddd;padding:.3em .8em;margin:.5em 0}
.group.culprit{border-left:5px solid #b00020}
tr.hl td{background:#fff3cd}.muted{color:#666}.bad{color:#b00020}
.ok{color:green}.failed{color:#b00}.empty{color:gray}.suspect{color:#b00020}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em;margin:.4em 0}
dt{color:#555}dd{margin:0}nav a{margin-right:1em}
"""

def esc(value: Any) -> str:
    """Any value as HTML text: escaped, and encodable (lone surrogates written as escapes)."""
    return html.escape(printable(str(value)))


def utc(when: Any) -> str:
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    except (OverflowError, OSError, ValueError):
        return "—"


def number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—" if value is None else esc(value)
    return f"{value:.4g}"


def page(title: str, body: str, refresh: int = 0) -> str:
    """A whole document; `refresh`: seconds between reloads (a live page without script)."""
    meta = f"<meta http-equiv='refresh' content='{refresh}'>" if refresh else ""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width'>"
            f"{meta}<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"{body}</body></html>")


def section(title: str, render: Callable[[], str], anchor: str = "") -> str:
    """An h2 and its content; content other code wrote in a shape it should not have becomes a
    line saying so, never an error for the whole page."""
    try:
        inner = render()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        inner = f"<p class='bad'>could not be shown: {esc(type(exc).__name__)}: {esc(exc)}</p>"
    ident = f" id='{anchor}'" if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{inner}</section>"


def table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """Cells are HTML already; `classes` gives each row's class."""
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(_row(row, c) for row, c in zip(rows, classes or [""] * len(rows)))
    return f"<div class='scroll'><table><tr>{header}</tr>{body}</table></div>"


def _row(cells: list[str], cls: str) -> str:
    attribute = f" class='{cls}'" if cls else ""
    return f"<tr{attribute}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def ranks_words(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0–2, 5`."""
    return ("rank " if len(ranks) == 1 else "ranks ") + spans_text(ranks)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_ints(value: Any) -> list[int]:
    return [v for v in as_list(value) if isinstance(v, int) and not isinstance(v, bool)]


def error_page(message: str) -> str:
    """What a page route answers when there is no such incident, or it cannot be read."""
    return page("llmmon: incident not shown", nav() + f"<h1>Not shown</h1><p>{esc(message)}</p>")


def nav() -> str:
    return "<nav><a href='/'>Node status</a><a href='/incidents'>Incidents</a></nav>"


# The list ------------------------------------------------------------------------------

def list_page(listing: Listing, job_id: str | None = None) -> str:
    title = f"Incidents of job {job_id}" if job_id else "Incidents on this node"
    return page(f"{title} · llmmon", nav() + f"<h1>{esc(title)}</h1>" + incidents_table(listing))


def incidents_table(listing: Listing, limit: int | None = None) -> str:
    """The newest `limit` incidents as a table, and the ones that could not be read."""
    rows = [[f"<a class='nowrap' href='/incidents/{esc(s['id'])}'>{utc(s.get('completed'))}</a>",
             esc(s.get("job_id", "?")), esc(s.get("node", "?")), esc(s.get("trigger", "?")),
             esc(s.get("verdict") or "")] for s in listing.incidents[:limit]]
    shown = (table(["completed", "job", "node", "trigger", "verdict"], rows) if rows
             else "<p class='muted'>no incident recorded here</p>")
    bad = "".join(f"<li>{esc(line)}</li>" for line in listing.unreadable)
    return shown + (f"<p class='bad'>Not readable:</p><ul class='bad'>{bad}</ul>" if bad else "")
