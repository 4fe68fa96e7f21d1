"""Query and panel helpers shared by every llmmon dashboard.

Each helper returns a grafana-foundation-sdk panel builder that already follows the rules the
lint tests enforce: the `datasource` variable on the panel and on every target, a unit, a
description, refIds, and an explicit size on the 24-column grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import ascii_uppercase
from typing import Iterable, Sequence

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_panel
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import statetimeline as state_timeline_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.builders import text as text_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as prom_model
from grafana_foundation_sdk.models import text as text_model
from grafana_foundation_sdk.models import units

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
Steps = Sequence[tuple[float | None, str]]
PanelBuilder = cogbuilder.Builder[dm.Panel]
# State timelines paginate past `perPage` rows (Grafana default 20): a wall must show every GPU
# of 32 eight-GPU nodes on one page.
MAX_TIMELINE_ROWS = 256


def m(metric: str, *scope: str) -> str:
    """A selector filtered by the dashboard variables.

    `scope` holds variable names (`node`, `gpu`, `job_id`, `rank`), each becoming
    `<name>=~"$<name>"`, or whole matchers (`'state="used"'`). `cluster` is always included:
    it is `.*` when the cluster label is absent.
    """
    matchers = ['cluster=~"$cluster"']
    matchers += [f'{item}=~"${item}"' if item.isidentifier() else item for item in scope]
    return f"{metric}{{{', '.join(matchers)}}}"


def rate(metric: str, *scope: str, fn: str = "rate") -> str:
    """`rate(selector[$__rate_interval])` (or `increase`/`irate` with `fn`)."""
    return f"{fn}({m(metric, *scope)}[$__rate_interval])"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Absolute threshold steps; the first value is None (the base colour)."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=value, color=color) for value, color in steps])


def value_text(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMap]:
    """Map exact values to (text, colour), e.g. {"0": ("down", "red")}."""
    return [dm.ValueMap(options={value: dm.ValueMappingResult(text=text, color=color, index=i)
                                 for i, (value, (text, color)) in enumerate(mapping.items())})]


def link(title: str, url: str) -> db.DashboardLink:
    return db.DashboardLink(title).type(dm.DashboardLinkType.LINK).url(url)


def _targets(queries: Iterable[Query], instant: bool, table: bool) -> list[prom.Dataquery]:
    targets = []
    for ref, query in zip(ascii_uppercase, queries):
        target = (prom.Dataquery().ref_id(ref).datasource(DATASOURCE).expr(query.expr)
                  .legend_format(query.legend or "__auto"))
        if instant:
            target.instant()
        else:
            target.range()
        if table:
            target.format(prom_model.PromQueryFormat.TABLE)
        targets.append(target)
    return targets


def _common(panel, title: str, description: str, unit: str, queries: Sequence[Query],
            width: int, height: int, *, instant: bool = False, table: bool = False,
            steps: Steps | None = None, mappings: list | None = None,
            links: Sequence[db.DashboardLink] = (), data_links: Sequence[db.DashboardLink] = (),
            min_value: float | None = None, max_value: float | None = None,
            no_value: str | None = None, overrides: Sequence[tuple[str, list]] = ()):
    panel = (panel.title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(width).height(height).targets(_targets(queries, instant, table)))
    if steps:
        panel.thresholds(thresholds(*steps))
    if mappings:
        panel.mappings(mappings)
    if links:
        panel.links(list(links))
    if data_links:
        panel.data_links(list(data_links))
    if min_value is not None:
        panel.min(min_value)
    if max_value is not None:
        panel.max(max_value)
    if no_value is not None:
        panel.no_value(no_value)
    for field, properties in overrides:  # "/regex/" or a field name
        if len(field) > 1 and field.startswith("/") and field.endswith("/"):
            panel.override_by_regexp(field[1:-1], properties)
        else:
            panel.override_by_name(field, properties)
    return panel


def timeseries(title: str, description: str, unit: str, *queries: Query, width: int = 12,
               height: int = 8, steps: Steps | None = None, stack: bool = False,
               bars: bool = False, **options) -> timeseries_panel.Panel:
    """A time series; with `steps` the thresholds are drawn as dashed lines."""
    panel = _common(timeseries_panel.Panel(), title, description, unit, queries, width, height,
                    steps=steps, **options)
    panel.legend(cb.VizLegendOptions().show_legend(True)
                 .display_mode(common.LegendDisplayMode.LIST)
                 .placement(common.LegendPlacement.BOTTOM))
    panel.tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                  .sort(common.SortOrder.DESCENDING))
    if steps:
        panel.thresholds_style(cb.GraphThresholdsStyleConfig()
                               .mode(common.GraphThresholdsStyleMode.DASHED))
    if stack:
        panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
        panel.fill_opacity(40)
    if bars:
        panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    return panel


def stat(title: str, description: str, unit: str, *queries: Query, width: int = 3,
         height: int = 4, steps: Steps = ((None, "green"),), **options) -> stat_panel.Panel:
    """A single current value (instant query), coloured by its thresholds."""
    panel = _common(stat_panel.Panel(), title, description, unit, queries, width, height,
                    instant=True, steps=steps, **options)
    return (panel.color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.NONE)
            .text_mode(common.BigValueTextMode.AUTO)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"])
                            .values(False)))


def state_timeline(title: str, description: str, unit: str, *queries: Query, width: int = 12,
                   height: int = 8, steps: Steps, **options) -> state_timeline_panel.Panel:
    """One row per series, coloured by thresholds: patterns across series stand out."""
    panel = _common(state_timeline_panel.Panel(), title, description, unit, queries, width,
                    height, steps=steps, **options)
    return (panel.color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .show_value(common.VisibilityMode.NEVER).merge_values(False).row_height(0.9)
            .per_page(MAX_TIMELINE_ROWS)
            .line_width(0).fill_opacity(90)
            .legend(cb.VizLegendOptions().show_legend(False)))


def heatmap(title: str, description: str, unit: str, query: Query, width: int = 12,
            height: int = 8, **options) -> heatmap_panel.Panel:
    """Series as heatmap rows (no bucketing): y = the legend, colour = the value."""
    panel = _common(heatmap_panel.Panel(), title, description, unit, [query], width, height,
                    **options)
    return (panel.calculate(False)
            .color(heatmap_panel.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME)
                   .scheme("Oranges").scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5)
                   .steps(64))
            .rows_frame(heatmap_panel.RowsHeatmapOptions().layout(common.HeatmapCellLayout.UNKNOWN))
            .cell_values(heatmap_panel.CellValues().unit(unit))
            .y_axis(heatmap_panel.YAxisConfig().axis_placement(common.AxisPlacement.LEFT))
            .show_legend())


def table(title: str, description: str, *queries: Query, width: int = 12, height: int = 8,
          columns: Sequence[str], renames: dict[str, str] | None = None,
          unit: str = units.NoUnit, sort_by: str | None = None,
          **options) -> table_panel.Panel:
    """Instant queries merged into one row per label set, showing only `columns` in order.

    Every query must yield the same identifying labels (aggregate with `by (...)`), so that
    Grafana's `merge` transformation joins their values into one row.
    """
    panel = _common(table_panel.Panel(), title, description, unit, queries, width, height,
                    instant=True, table=True, **options)
    panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
        "includeByName": {name: True for name in columns},
        "indexByName": {name: i for i, name in enumerate(columns)},
        "renameByName": renames or {},
    }))
    if sort_by:
        panel.sort_by([cb.TableSortByFieldState().display_name(
            (renames or {}).get(sort_by, sort_by))])
    return panel.cell_height(common.TableCellHeight.SM).show_header(True)


def text(title: str, content: str, width: int = 24, height: int = 3) -> text_panel.Panel:
    """Markdown guidance; no query, so it has neither datasource nor unit."""
    return (text_panel.Panel().title(title).span(width).height(height)
            .mode(text_model.TextMode.MARKDOWN)
            .content(content))


def row(title: str) -> db.Row:
    return db.Row(title)


def prop(name: str, value: object) -> dm.DynamicConfigValue:
    """One field-override property, e.g. prop("unit", "s")."""
    return dm.DynamicConfigValue(id_val=name, value=value)
