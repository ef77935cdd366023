"""report.html: the audit's summary rendered with Jinja2 (templates/audit.html.j2, package data).

One self-contained page: the figures are data: URIs, the styles are inline, there is no script and
no link to any other host; `@media print` lays it out for paper. Autoescaping is on, so every
box name, model path or LLM reply in the summary is shown as text, never as markup.
"""
from __future__ import annotations

from typing import Any, Mapping

TEMPLATE = "audit.html.j2"


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("ctrlsim.experiments.audit", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["ci"] = format_ci
    env.filters["num"] = format_num
    env.filters["pct"] = format_pct
    return env


def format_num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_ci(e: Mapping[str, Any] | None, digits: int = 2) -> str:
    """"12.50 [9.10, 15.90]" (the 95% interval), "12.50 [n/a]" with one observation, "n/a" with none:
    an estimate's JSON (`Estimate.to_dict`) through the one formatter of the tables."""
    from ctrlsim.metrics.stats import Estimate, format_estimate

    if not e or e.get("value") is None:
        return "n/a"
    return format_estimate(Estimate.from_dict(e), digits=digits, bounds=True, missing="n/a")


def format_pct(e: Mapping[str, Any] | None, digits: int = 2) -> str:
    """A share's estimate (in [0, 1]) in percent: "23.15 [14.81, 37.04]"."""
    from ctrlsim.metrics.stats import Estimate, format_estimate

    if not e or e.get("value") is None:
        return "n/a"
    return format_estimate(Estimate.from_dict(e), scale=100, digits=digits, bounds=True, missing="n/a")


def render_report(summary: Mapping[str, Any], figures: Mapping[str, dict]) -> str:
    return _environment().get_template(TEMPLATE).render(s=summary, figures=figures)


LLMS_TEMPLATE = "audit_llms.html.j2"


def render_llms_report(summary: Mapping[str, Any]) -> str:
    """report.html of an audit run once per probe model (`audit.sensitivity`): the same page rules."""
    return _environment().get_template(LLMS_TEMPLATE).render(s=summary)
