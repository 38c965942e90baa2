"""The report of ``charlm check --full``: what its figures mean (the verdicts: failures and notes)
and how they are written down (``report.md``; ``report.json`` is the same dictionary)."""

from __future__ import annotations

# A graphed run against the eager one: the same arithmetic, so a mistake in the graphs (a state not
# carried, a weight read stale) shows within the first windows, in the loss at step 10. The validation
# bpc at the end is compared too, but only noted: some runs are not repeatable on a GPU (rnn through
# cuDNN on an H200: two eager runs of one seed ended at 3.58 and 3.98 bpc, their step-10 losses equal).
FIRST_LOSS_GAP = 1e-3  # a failure: the loss at step 10
GRAPH_BPC_GAP = 0.01  # a note: the validation bpc at the end
GOAL_PER_FLOP = 0.5  # the performance goal: bf16 with graphs at least half the fused LSTM's rate per FLOP
SLOWER_MARGIN = 0.95  # graphs "slower than eager" below this fraction of eager's rate (the rounds' noise)


def bench_problems(label: str, table: dict, cuda: bool) -> list[str]:
    """What in one benchmark run is a failure: a fast path not used, a wrong layer type."""
    problems = []
    for result in table["results"][1:]:
        name = result["name"]
        if cuda and result.get("eval_path") != "cuda graph":
            problems.append(f"{name}: evaluation {result.get('eval_path')}")
        wanted = {"graphs": "cuda graph", "compile": "compiled"}
        for word, path in wanted.items():
            if word in label and result.get("train_path") != path:
                problems.append(f"{name}: training {result.get('train_path')}")
        if "bf16" in label and "float16" in result.get("layer_dtypes", []):
            problems.append(f"{name}: a layer ran in float16 under bf16")
    return problems


def performance_notes(tables: dict) -> dict:
    """The goal, measured: cells under half the fused LSTM's rate per FLOP in bf16 with graphs, and
    cells whose graphs trained slower than eager (bf16 both)."""
    notes = {}
    graphed, eager = tables.get("bf16 + graphs"), tables.get("bf16")
    if graphed:
        notes["below_goal_per_flop"] = [
            {"cell": r["name"], "ratio": round(r["train_ratio_flop_normalised"], 3)}
            for r in graphed["results"][1:]
            if r["train_ratio_flop_normalised"] < GOAL_PER_FLOP
        ]
    if graphed and eager:
        rates = {r["name"]: r["train_chars_per_second"]["median"] for r in eager["results"][1:]}
        notes["graphs_slower_than_eager"] = [
            {"cell": r["name"], "graphs_over_eager": round(r["train_chars_per_second"]["median"] / rates[r["name"]], 3)}
            for r in graphed["results"][1:]
            if r["name"] in rates and r["train_chars_per_second"]["median"] < SLOWER_MARGIN * rates[r["name"]]
        ]
    return notes


def training_verdicts(rows: list[dict], cuda: bool) -> list[dict]:
    """Each run's ``problem``, if it has one: an error, a graph not used or not checked, or a graphed
    loss at step 10 more than ``FIRST_LOSS_GAP`` from the eager run's; and a ``note`` where only the
    validation bpc at the end differs (by more than ``GRAPH_BPC_GAP``)."""
    eager = {row["cell"]: row for row in rows if row["mode"] == "eager"}
    for row in rows:
        if row.get("error"):
            row["problem"] = row["error"]
        elif row["mode"] == "cuda graph":
            record = row.get("cuda_graph") or {}
            if not (record.get("active") and record.get("checked")):
                row["problem"] = f"graphs not used: {record.get('failure')}"
            elif row["cell"] in eager and eager[row["cell"]].get("valid_bpc") is not None:
                reference = eager[row["cell"]]
                row["bpc_gap"] = abs(row["valid_bpc"] - reference["valid_bpc"])
                loss_gap = abs((row.get("first_loss") or 0.0) - (reference.get("first_loss") or 0.0))
                if loss_gap > FIRST_LOSS_GAP:
                    row["problem"] = (
                        f"loss at step 10 {row['first_loss']:.5f} against eager {reference['first_loss']:.5f}"
                    )
                elif row["bpc_gap"] > GRAPH_BPC_GAP:
                    row["note"] = (
                        f"validation bpc {row['valid_bpc']:.4f} against eager {reference['valid_bpc']:.4f}, "
                        "the loss at step 10 the same: a run that does not repeat exactly"
                    )
    return rows


# --- report.md ---------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# charlm check --full on {env.get('gpu') or env.get('cpu') or env['device']}, {env['date']}",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    lines += ["", "## Steps", "", "| step | status | seconds | limit | found |", "|---|---|---:|---:|---|"]
    lines += [
        f"| {s['name']} | {s['status']} | {s['seconds']} | {s['limit_seconds']:.0f} | {s['detail']} |"
        for s in report.get("steps", [])
    ]
    if report.get("failures"):
        lines += ["", "## Failures", ""] + [f"- {failure}" for failure in report["failures"]]
    if report.get("check"):
        lines += ["", "## check", "", "| check | result | figure | tolerance |", "|---|---|---|---|"]
        lines += [f"| {r['check']} | {r['result']} | {r['figure']} | {r['tolerance']} |" for r in report["check"]]
    if report.get("cuda_tests"):
        lines += ["", "## cuda tests", ""] + [f"- `{s['command']}`: {s['summary']}" for s in report["cuda_tests"]]
    for label, table in report.get("benchmark", {}).items():
        settings = table["settings"]
        untrusted = (
            "" if table.get("trustworthy", True) else "; not trustworthy: " + "; ".join(table.get("disturbances", []))
        )
        lines += [
            "",
            f"## Benchmark, {label} ({settings['params']} parameters, batch {settings['batch_size']} × "
            f"{settings['bptt']} steps{untrusted})",
            "",
            "| model | hidden | train chars/s | × fused LSTM | × per FLOP | eval chars/s | eval path | train path |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in table["results"]:
            lines.append(
                f"| {r['name']} | {r['hidden_size']} | {r['train_chars_per_second']['median']:,.0f} | "
                f"{r['train_ratio']:.2f} | {r['train_ratio_flop_normalised']:.2f} | "
                f"{r['eval_chars_per_second']['median']:,.0f} | {r['eval_path']} | {r.get('train_path', 'eager')} |"
            )
    notes = report.get("performance", {})
    if notes:
        below = ", ".join(f"{n['cell']} {n['ratio']}" for n in notes.get("below_goal_per_flop", [])) or "none"
        slower = (
            ", ".join(f"{n['cell']} {n['graphs_over_eager']}×" for n in notes.get("graphs_slower_than_eager", []))
            or "none"
        )
        lines += [
            "",
            "## Performance goal",
            "",
            f"- bf16 with graphs under {GOAL_PER_FLOP}× the fused LSTM per FLOP: {below}",
            f"- graphs slower than eager (bf16): {slower}",
        ]
    if report.get("training"):
        lines += [
            "",
            "## Training (embedded corpus `pydoc`)",
            "",
            "| cell | mode | loss at step 10 | valid bpc | test bpc | chars/s | graph check | problem or note |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for r in report["training"]:
            graph = r.get("cuda_graph") or {}
            check = (
                (
                    f"active {graph.get('active')}, checked {graph.get('checked')}, "
                    f"{graph.get('max_difference')} ≤ {graph.get('tolerance')}"
                )
                if graph
                else "-"
            )

            def bpc(value):
                return f"{value:.4f}" if isinstance(value, (int, float)) else "-"

            lines.append(
                f"| {r['cell']} | {r['mode']} | {bpc(r.get('first_loss'))} | {bpc(r.get('valid_bpc'))} | "
                f"{bpc(r.get('test_bpc'))} | "
                f"{r.get('chars_per_s', '-')} | {check} | {r.get('problem') or r.get('note', '')} |"
            )
    return "\n".join(lines) + "\n"
