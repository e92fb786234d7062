"""Results to JSON, JSON to ``docs/benchmarks.md`` and PNG plots under ``docs/img/``.

A full run writes ``benchmarks/results/<name>.json`` and regenerates the docs page from every
JSON file there (so ``--only NAME`` refreshes one section and keeps the others). A ``--quick``
run writes to ``benchmarks/results/quick/`` and renders ``benchmarks/results/quick/benchmarks.md``
with its plots beside it, never touching the docs: smoke-test numbers are not published.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img"

ORDER = [
    "goals",
    "goals19",
    "progress",
    "beat",
    "throughput",
    "read",
    "reader",
    "http",
    "sweep",
    "stale",
    "false_stale",
    "cluster",
    "gateway",
    "metrics",
    "sidecar",
]


def results_dir(quick: bool) -> Path:
    return RESULTS / "quick" if quick else RESULTS


def write_result(result: dict[str, Any], machine: dict[str, Any], quick: bool) -> Path:
    out = results_dir(quick)
    out.mkdir(parents=True, exist_ok=True)
    result = {**result, "machine": machine, "quick": quick}
    path = out / f"{result['name']}.json"
    path.write_text(json.dumps(_clean(result), indent=1, ensure_ascii=False) + "\n")
    return path


def _clean(x: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def normalise(result: dict[str, Any], name: str, doc: str = "") -> dict[str, Any]:
    """Accept a result of another shape (the bench_reader / bench_sweep scripts): anything without
    ``tables`` is shown as a table of its scalar figures plus one table per list of records; the
    title and method come from the script's docstring when the result has none."""
    if "tables" in result:
        result.setdefault("name", name)
        return result
    first, _, rest = doc.strip().partition("\n\n")
    rows = []
    tables = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        elif isinstance(value, int | float | str | bool) or value is None:
            rows.append([prefix.rstrip("."), _cell(value)])
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            cols = list(dict.fromkeys(k for v in value for k in v))
            flat = [[_cell(v.get(c)) if not isinstance(v.get(c), dict | list) else "…"
                     for c in cols] for v in value]  # fmt: skip
            tables.append({"title": prefix.rstrip("."), "columns": cols, "rows": flat})

    for k, v in result.items():
        if k in ("method", "title", "name", "machine", "quick", "goals"):
            continue
        walk(f"{k}.", v)
    if rows:
        tables.insert(0, {"title": "Figures", "columns": ["figure", "value"], "rows": rows[:80]})
    method = " ".join(rest.split()) if rest else "(see the script's docstring)"
    return {
        "name": name,
        "title": result.get("title", " ".join(first.split()) or name),
        "method": result.get("method", method),
        "tables": tables,
        "plots": [],
        "data": result,
        "goals": result.get("goals", {}),
    }


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


# -- plots -----------------------------------------------------------------------------------


def plot(spec: dict[str, Any], folder: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra is not installed: tables only
        return None
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    kind = spec["kind"]
    if kind == "barh":
        ax.barh(spec["labels"], spec["values"], color="#4a7ab5")
        ax.set_xlabel(spec.get("xlabel", ""))
    elif kind == "grouped":
        labels = spec["labels"]
        series = spec["series"]
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            xs = [j + i * width for j in range(len(labels))]
            ax.bar(xs, [v or 0 for v in values], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
        ax.set_ylabel(spec.get("ylabel", ""))
        ax.legend(fontsize=8)
    elif kind == "line":
        for name, values in spec["series"].items():
            pts = [(x, y) for x, y in zip(spec["x"], values, strict=False) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        if spec.get("logx"):
            ax.set_xscale("log")
        if spec.get("logy"):
            ax.set_yscale("log")
        ax.set_xlabel(spec.get("xlabel", ""))
        ax.set_ylabel(spec.get("ylabel", ""))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    elif kind == "hist":
        ax.hist(spec["values"], bins=spec.get("bins", 20), color="#4a7ab5")
        for x, label in spec.get("vlines", []):
            ax.axvline(x, color="#c0392b", linestyle="--")
            ax.text(x, ax.get_ylim()[1] * 0.9, f" {label}", color="#c0392b", fontsize=8)
        ax.set_xlabel(spec.get("xlabel", ""))
        ax.set_ylabel(spec.get("ylabel", "count"))
    ax.set_title(spec.get("title", ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(folder / spec["file"])
    plt.close(fig)
    return spec["file"]


# -- markdown --------------------------------------------------------------------------------


def _table(t: dict[str, Any]) -> list[str]:
    lines = [f"**{t['title']}**", ""]
    cols = t["columns"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for row in t["rows"]:
        cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in row]
        cells += [""] * (len(cols) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    if t.get("note"):
        lines += ["", t["note"]]
    lines.append("")
    return lines


def _machine(m: dict[str, Any]) -> list[str]:
    pk = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items() if v)
    return [
        "| | |",
        "|---|---|",
        f"| CPU | {m.get('cpu_model')} ({m.get('cores')} cores, shared by client and server) |",
        f"| Python | {m.get('python')} ({m.get('implementation')}) on {m.get('platform')} |",
        f"| Redis | {m.get('redis_version')} (a private `redis-server` per benchmark, loopback, "
        "no persistence) |",
        f"| date | {m.get('date')} |",
        f"| load average at start | {m.get('loadavg')} |",
        f"| packages | {pk} |",
        "",
    ]


def render(quick: bool = False) -> Path:
    folder = results_dir(quick)
    found = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    img = folder / "img" if quick else IMG
    img_ref = "img"
    out = folder / "benchmarks.md" if quick else DOCS
    # the newest run's machine; the page also says which sections come from older runs
    runs = sorted((r for r in found.values() if "machine" in r),
                  key=lambda r: str(r["machine"].get("date")))  # fmt: skip
    machine = runs[-1]["machine"] if runs else {}
    by_date: dict[str, list[str]] = {}
    for r in runs:
        by_date.setdefault(str(r["machine"].get("date")), []).append(str(r.get("name")))
    if "goals19" in found:  # its table also shows the read, reader and progress rows
        from . import goals28
        from .goals_report import merge

        merge(found)
        section = goals28.build(found)  # issue 28's table: only results of goals19's run
        if section is not None:
            found[section["name"]] = section
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)

    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m benchmarks` (benchmarks/report.py) from "
        "benchmarks/results/*.json. Do not edit by hand; the prose lives in "
        "benchmarks/report.py and the benchmark modules. -->",
        "",
        "How much jobpulse costs the computation, Redis and the worker process, side by side "
        "with the seed pattern (a Lua lock renew plus a pipelined HSET + EXPIRE) and with what "
        "Python job queues do for progress (SAQ, RQ, Celery) and BullMQ (Node) does for progress "
        "plus its lock. The first section is issue 28's goal table, every row from one "
        "`--only goals` run beside the seed and BullMQ, with the sidecar's rows; then issue "
        "19's table of the beat diet, with the figures measured before it. Every figure is "
        "shown beside a "
        "baseline measured in the same run, because the machine is shared and noisy: read the "
        "ratios, not the absolute numbers.",
        "",
        "Run it: `nox -s bench` or `python -m benchmarks` (`--quick` for a smoke run, "
        "`--soak` for the 10-minute false-STALE soak, `--only NAME`). See "
        "`benchmarks/README.md`.",
        "",
        "## Machine",
        "",
        *_machine(machine),
    ]
    if len(by_date) > 1:
        lines += ["The benchmarks' runs (each section's figures come from one run):", ""]
        lines += [f"- {date}: {', '.join(names_)}" for date, names_ in sorted(by_date.items())]
        lines.append("")
    if quick:
        lines += ["> **Quick run**: short windows, smoke-test numbers only.", ""]

    summary = []
    for n in names:
        for goal, ok in (found[n].get("goals") or {}).items():
            met = "not measured" if ok is None else ("met" if ok else "**not met**")
            summary.append([found[n].get("title", n), goal, met])
    if summary:
        lines += ["## Goals at a glance", ""]
        lines += _table({"title": "Goals", "columns": ["benchmark", "goal", "result"],
                         "rows": summary})  # fmt: skip

    newest = str(machine.get("date"))

    def older(r: dict[str, Any]) -> str | None:
        """The date of ``r``'s run when it is older than the page's newest run."""
        date = str((r.get("machine") or {}).get("date", newest))
        return date if len(by_date) > 1 and date != newest else None

    losses = []
    for n in names:
        when = older(found[n])
        tag = f" (run of {when}: it may predate later changes)" if when else ""
        losses += [(found[n].get("title", n) + tag, f) for f in found[n].get("findings", [])]
    if losses:
        lines += ["## Where jobpulse loses, and why", ""]
        lines += [f"- **{title}**: {text}" for title, text in losses]
        lines.append("")

    for n in names:
        r = found[n]
        lines += [f"## {r.get('title', n)}", ""]
        if r.get("issue"):
            lines += [f"*Issue {r['issue']} · `python -m benchmarks --only {n}`*", ""]
        when = older(r)
        if when:
            lines += [f"> The run of {when}, older than this page's newest ({newest}): its "
                      "figures and prose may predate later changes (`python -m benchmarks "
                      f"--only {n}` measures it again).", ""]  # fmt: skip
        lines += [f"**Method.** {r.get('method', '')}", ""]
        for t in r.get("tables", []):
            lines += _table(t)
        for spec in r.get("plots", []):
            file = plot(spec, img)
            if file:
                lines += [f"![{spec.get('title', '')}]({img_ref}/{file})", ""]
        if r.get("skipped"):
            lines += [f"> Not run: {r['skipped']}", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n")
    return out
