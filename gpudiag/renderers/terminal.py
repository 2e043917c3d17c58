"""The short terminal summary (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpudiag.renderers.labels import shorten
from gpudiag.renderers.units import budget_text, fmt_ns, fmt_pct

FUSION_TOP = 3  # a summary: the HTML report lists all ten candidates
# A kernel name or chain is shown in at most this many characters, cut in the middle (report.json
# keeps it whole): a 10 MB name took 323 s to wrap into the fusion table. Ids and verdicts are never cut.
NAME_WIDTH = 120


def widest_word(cells) -> int:
    """The length of the longest space-separated word in ``cells``: the width below which a
    column would cut a word (an id, a verdict) instead of wrapping between words."""
    return max((len(w) for c in cells for w in str(c).split()), default=0)


def whole_column(table: Table, header: str, cells, **kwargs) -> None:
    """Add a column whose words (rule ids, classes, verdicts) are never cut: at least as wide as
    its longest word, however narrow the output (80 columns when it is not a terminal). The table
    is then printed with :func:`print_whole`, which lets a line run past the width rather than crop it."""
    table.add_column(header, min_width=widest_word(cells), **kwargs)


def print_whole(console: Console, table: Table) -> None:
    """Print ``table`` without cropping lines at the console's width (a table that holds
    :func:`whole_column` columns can be wider than a narrow console)."""
    console.print(table, crop=False)


def micro_batch_note(steps: dict) -> str:
    """" · each over k micro-batches" where a step is an optimizer step over several (gradient
    accumulation), and the closure evaluations where an optimizer ran its closure more than once
    (LBFGS); empty otherwise."""
    mb = steps.get("micro_batches") or {}
    parts = []
    if (mb.get("per_step") or 0) > 1:
        parts.append(f"each one optimizer step over {mb['per_step']:g} micro-batches")
    if (mb.get("closure_evaluations") or 0) > 1:
        parts.append(f"{mb['closure_evaluations']:g} closure evaluations per step")
    return "".join(f" · {p}" for p in parts)


def render(result: dict, console: Console | None = None, top: int = 5) -> None:
    """Print device, step time, GPU busy %, the breakdown, the top kernels, the recommendations and
    the top fusion candidates."""
    console = console or Console()
    steps = result["steps"]
    console.print(Text(result["device"]["name"], style="bold") + Text(f" · {steps['measured']} measured steps ({steps['source']})"
                                                                     + micro_batch_note(steps)),
                  highlight=False)  # Text, not markup: names and regexes hold "[" 
    for warning in result.get("warnings", []):
        console.print(Text("warning: ", style="yellow") + Text(warning), highlight=False)
    summary = Table(show_header=True, header_style="bold")
    bp = result["breakdown_percent"]
    classes = ("compute", "bandwidth", "overhead") + (("communication",) if bp.get("communication") else ()) + ("idle",)
    for col in ("step time (median)", "GPU busy") + classes:
        summary.add_column(col, justify="right")
    summary.add_row(fmt_ns(steps["step_time_ns"]["median"]), fmt_pct(result["gpu_busy_percent"]),
                    *(fmt_pct(bp.get(c)) for c in classes))
    console.print(summary)
    line = overhead_split_line(result)
    if line:
        console.print(Text(line), highlight=False)
    render_communication(result, console)
    render_outliers(result, console)
    render_bare(result, console)
    for line in request_lines(result):
        console.print(Text(line), highlight=False)
    render_compiled(result, console)
    kernels = Table(title=f"top {top} kernels (per measured step)", show_header=True, header_style="bold")
    kernels.add_column("kernel", overflow="ellipsis", max_width=60)
    shown = result["top_kernels"][:top]
    for col in ("time/step", "share"):
        kernels.add_column(col, justify="right")
    whole_column(kernels, "class", [k["kernel_class"] for k in shown], justify="right")
    whole_column(kernels, "evidence", [k["evidence"] for k in shown], justify="right")
    for k in shown:
        kernels.add_row(Text(shorten(k["label"], NAME_WIDTH)),  # Text: names hold "[" that markup would eat
                        fmt_ns(k["time_ns_per_step"]),
                        fmt_pct(k["share_of_kernel_time_percent"]), k["kernel_class"], k["evidence"])
    print_whole(console, kernels)
    if line := settle_line(result):
        console.print(Text(line), highlight=False)
    render_recommendations(result, console)
    render_fusion(result, console)


def settle_line(result: dict, top: int = 3) -> str | None:
    """'classes by name only: --ncu would settle first NAME (large tile, 61 % agreed with ncu), ...';
    None where no kernel's class rests on a weak basis (or an older report)."""
    first = ((result.get("classification") or {}).get("ncu_settles_first") or [])[:top]
    if not first:
        return None
    return "classes by kernel name only; `--ncu` would settle first: " + "; ".join(
        f"{shorten(k['name'], 50)} ({k['kernel_class']} by {k['basis']}, {100 * k['confidence']:.0f} % agreed with ncu)"
        for k in first)


def overhead_split_line(result: dict) -> str | None:
    """The breakdown's overhead in its two parts: 'overhead 40.9 % = launch-bound 39.1 % + host
    compute 1.8 % (...)'; None for a report without the split (older reports) or without overhead."""
    split, bp = result.get("overhead_split_percent") or {}, result.get("breakdown_percent") or {}
    if not split or not bp.get("overhead"):
        return None
    threshold = (result.get("idle") or {}).get("host_compute_threshold_ns")
    return (f"overhead {fmt_pct(bp['overhead'])} = launch-bound {fmt_pct(split.get('launch_bound'))} (issuing work) "
            f"+ host compute {fmt_pct(split.get('host_compute'))} (CPU work, no CUDA call"
            f"{' for over ' + fmt_ns(threshold) if threshold else ''})")


def render_recommendations(result: dict, console: Console, title: str = "recommendations (by expected saving per step)") -> None:
    """The top 5 recommendations: rule, what, predicted and measured (trial) saving per step."""
    recs = result.get("recommendations") or []
    if recs:
        table = Table(title=title, show_header=True, header_style="bold")
        rows = [(rec["rule_id"], rec["title"], "not predicted" if rec.get("predicted") is False else saving_text(rec),
                 trial_saving_text(rec, result.get("trials") is not None)) for rec in recs[:5]]
        whole_column(table, "rule", [r[0] for r in rows], no_wrap=True)
        table.add_column("what", overflow="fold", max_width=60)
        whole_column(table, "predicted/step", [r[2] for r in rows], justify="right")
        whole_column(table, "measured (trial)", [r[3] for r in rows], justify="right")
        for rule_id, what, predicted, measured in rows:
            table.add_row(Text(rule_id), Text(what), predicted, Text(measured))
        print_whole(console, table)
        pairs = overlap_pairs(recs[:5])
        if pairs:
            console.print(Text("not to be added up (they count the same time): " + "; ".join(pairs)), highlight=False)


def trial_saving_text(rec: dict, trials_ran: bool) -> str:
    """A recommendation's measured saving and its trial's change when conclusive; "inconclusive"
    with the trial's estimate and 95 % interval; the trial's failure; "not tried", or "not
    measured" for a report without trials (an export made without gpudiag profile)."""
    status = rec.get("trial_status")
    if rec.get("trial_contradicts"):
        return (f"contradicted: {rec['trial_change']} measured {fmt_ns(rec.get('trial_saving_ns'))}"
                f"{interval_text(rec.get('trial_saving_ci_ns'))}")
    if rec.get("measured_saving_ns") is not None:
        flag = ", changes results" if rec.get("trial_changes_results") or status == "changes results" else ""
        return f"{fmt_ns(rec['measured_saving_ns'])} ({rec['trial_change']}{flag})"
    if status == "inconclusive":
        return f"inconclusive ({rec['trial_change']}: {fmt_ns(rec.get('trial_saving_ns'))}{interval_text(rec.get('trial_saving_ci_ns'))})"
    if status:
        return f"{status} ({rec['trial_change']})"
    if rec.get("trial_not_credited"):
        return "not credited: " + rec["trial_not_credited"]
    return "not tried" if trials_ran else "not measured"


def interval_text(interval) -> str:
    """', 95 % CI −1.20 ms … 3.40 ms' for a [low, high] interval in ns; '' without one."""
    if not interval:
        return ""
    return f", 95 % CI {fmt_ns(interval[0])} … {fmt_ns(interval[1])}"


def cost_text(trial: dict, unit: str) -> str:
    """A trial's one-time cost and the steps (or requests) that repay it: '41.2 s, repaid in 820
    steps'; '–' without a cost."""
    cost = trial.get("one_time_cost_s")
    if cost is None:
        return "–"
    payback = trial.get("payback_steps")
    return f"{cost:.1f} s" + (f", repaid in {payback:.0f} {unit}" if payback is not None else "")


def trial_reason_text(trial: dict) -> str | None:
    """Why a trial is inconclusive or failed, and with which baselines it was compared when none
    ran after it; None when there is nothing to say."""
    parts = [p for p in (trial.get("verdict_reason") or trial.get("error"),) if p]
    if trial.get("baseline_after") is False:
        parts.append(f"compared with {trial.get('compared_with')}")
    return "; ".join(parts) or None


def render_trials(result: dict, console: Console | None = None) -> None:
    """The trials: change, status and why, baseline and trial step times, the saving with its 95 %
    interval and p-value, the one-time cost and its payback, the predicted saving; then the note
    on the baseline runs, what the budget bought (:func:`budget_text`, when the report has
    ``trials_budget``) and the recommendations ranked by conclusive measured savings."""
    console = console or Console()
    trials = result.get("trials") or []
    if not trials:
        return
    unit = "requests" if result.get("inference") else "steps"
    table = Table(title="trials: changes applied to the script and measured bare", header_style="bold")
    whole_column(table, "change", [t["change"] for t in trials])  # an id (gpudiag profile --try) and a verdict
    whole_column(table, "status", [t["status"] for t in trials])
    for col in ("baseline", "with it", "saving", "95 % CI", "p", "one-time cost", "predicted"):
        table.add_column(col, justify="right", overflow="fold")
    for t in trials:
        saving = "–" if t.get("saving_ns") is None else f"{fmt_ns(t['saving_ns'])} ({fmt_pct(t['saving_percent'])})"
        ci = t.get("saving_ci_ns")
        interval = f"{fmt_ns(ci[0])} … {fmt_ns(ci[1])}" if ci else "–"
        predicted = fmt_ns(t.get("predicted_saving_ns")) if t.get("predicted_saving_ns") is not None else "not predicted"
        p_value = "–" if t.get("p_value") is None else f"{t['p_value']:.2g}"
        status = t["status"] + (" (time per sample)" if t.get("per") == "sample" else "")
        table.add_row(Text(t["change"]), Text(status), fmt_ns(t.get("baseline_step_ns")),
                      fmt_ns(t.get("trial_step_ns")), saving, interval, p_value, cost_text(t, unit), predicted)
    print_whole(console, table)
    for t in trials:
        reason = trial_reason_text(t)
        if reason:
            console.print(Text(f"{t['change']} {t['status']}: {reason}"), highlight=False)
    note = next((t["baseline_note"] for t in trials if t.get("baseline_note")), None)
    if note:
        console.print(Text(f"baselines: {note}"), highlight=False)
    if result.get("trials_budget"):
        console.print(Text(budget_text(result["trials_budget"])), highlight=False)
    render_patches(result, console)
    render_recommendations(result, console, "recommendations (by conclusive measured saving where a trial ran, "
                                            "else predicted)")


def patch_line(patch: dict) -> str:
    """One line on a patch: made or not, its verification and the patched saving against the trial's."""
    if not patch.get("made"):
        where = f"; it goes {patch['where']}" if patch.get("where") else ""
        snippet = f": {patch['snippet']}" if patch.get("snippet") else ""
        return f"patch {patch['change']}: none ({patch.get('why_not')}){where}{snippet}"
    v = patch.get("verification") or {}
    line = f"patch {patch['change']}: {v.get('status', 'not verified')}"
    if v.get("saving_ci_percent"):
        ci = v["saving_ci_percent"]
        line += f", patched script {fmt_pct(v.get('saving_percent'))} [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]"
        if v.get("trial_ci_percent"):
            tci = v["trial_ci_percent"]
            line += f", its trial {fmt_pct(v.get('trial_saving_percent'))} [{fmt_pct(tci[0])}, {fmt_pct(tci[1])}]"
    elif v.get("why"):
        line += f" ({v['why']})"
    return line + f"; changes/{patch['change']}.patch"


def render_patches(result: dict, console: Console) -> None:
    """The patches of the measured wins (:func:`patch_line` each), then the diff of the first
    verified one and how to apply it."""
    patches = result.get("patches") or []
    for patch in patches:
        console.print(Text(patch_line(patch)), highlight=False)
        for note in patch.get("notes") or []:
            console.print(Text(f"  note: {note}"), highlight=False)
    top = next((p for p in patches if p.get("made") and (p.get("verification") or {}).get("status") == "verified"), None)
    if top is not None:
        console.print(Text(top["diff"]), highlight=False, soft_wrap=True)
        console.print(Text(f"apply it: gpudiag apply RUN_DIR {top['change']} (or git apply in {top['script_dir']})"),
                      highlight=False)


def render_communication(result: dict, console: Console) -> None:
    """One line on collective communication (exposed vs hidden), then the per-rank table when the
    export holds several processes (:mod:`gpudiag.analysis.ranks.processes`)."""
    comm = result.get("communication")
    if comm:
        console.print(Text(f"communication: {fmt_ns(comm['kernel_ns_per_step'])}/step in collectives, "
                           f"{fmt_ns(comm['exposed_ns_per_step'])} exposed ({fmt_pct(comm['exposed_percent_of_step'])} "
                           f"of the step), the rest hidden behind compute"
                           + (f"; {fmt_ns(comm['wait_ns_per_step'])} of it waiting for other ranks, "
                              f"{fmt_ns(comm['exposed_transfer_ns_per_step'])} of transfer exposed"
                              if comm.get("wait_ns_per_step") is not None else "")), highlight=False)
    ranks = result.get("ranks")
    if not ranks:
        return
    table = Table(title=f"ranks ({len(ranks['ranks'])} processes)", show_header=True, header_style="bold")
    for col in ("rank", "pid", "GPU", "ops", "step time (median)", "without profiler", "GPU busy",
                "exposed comm/step", "vs fastest"):
        table.add_column(col, justify="right")
    for r in ranks["ranks"]:
        ops = r.get("op_calls_recorded")
        table.add_row(Text(str(r["rank"] if r["rank"] is not None else "-")), str(r["pid"]), str(r["device_id"]),
                      "-" if ops is None else str(ops),
                      fmt_ns(r["step_time_ns_median"]), fmt_ns(r.get("bare_step_time_ns_median")),
                      fmt_pct(r["gpu_busy_percent"]),
                      fmt_ns(r["exposed_communication_ns_per_step"]), fmt_pct(r["slower_than_fastest_percent"]))
    console.print(table)
    straggler = ranks.get("straggler") or ranks.get("slowest")  # "slowest": a report written before the rename
    if straggler:
        console.print(Text(straggler["text"]), highlight=False)


def overlap_pairs(recs: list[dict]) -> list[str]:
    """"GD-A with GD-B, GD-C" for each of the given recommendations whose saving overlaps later ones'
    (their ``overlaps`` field), so that each pair is named once."""
    shown = [r["rule_id"] for r in recs]
    out = []
    for i, rec in enumerate(recs):
        later = [b for b in shown[i + 1:] if b in (rec.get("overlaps") or [])]
        if later:
            out.append(f"{rec['rule_id']} with {', '.join(later)}")
    return out


def outlier_lines(result: dict, top: int = 3) -> list[str]:
    """The outlier-step finding as lines: how many steps, the rule, their share of the time and
    whether they recur at a fixed interval, then the ``top`` slowest with their two largest causes.
    Empty when there is none (or the report predates outlier steps)."""
    found = result.get("outlier_steps") or {}
    if not found.get("count"):
        return []
    every = f", every {found['period_steps']} steps" if found.get("period_steps") else ""
    lines = [f"{found['count']} outlier steps (over {found['factor']:g}× the median measured step, "
             f"{fmt_ns(found['median_step_time_ns'])}; {fmt_pct(found['share_of_measured_time_percent'])} of the measured "
             f"time{every}) are left out of the numbers above; the slowest:"]
    for s in found["steps"][:top]:
        why = "; ".join(c["text"] for c in s["causes"][:2]) or "no single cause stands out"
        lines.append(f"  step {s['step']}: {fmt_ns(s['step_time_ns'])} ({s['times_median']:.1f}× the median): {why}")
    return lines


def render_outliers(result: dict, console: Console) -> None:
    for i, line in enumerate(outlier_lines(result)):
        console.print((Text("outliers: ", style="yellow") if i == 0 else Text("")) + Text(line), highlight=False)


def render_bare(result: dict, console: Console) -> None:
    """One line: the step time under the profiler and without it (the bare run), when measured."""
    rep = result.get("representativeness")
    if rep and "bare_step_time_ns" in rep:
        console.print(Text(f"step time under the profiler {fmt_ns(rep['profiled_step_time_ns'])}, without it "
                           f"{fmt_ns(rep['bare_step_time_ns'])} ({rep['inflation_percent']:+.0f} %)"), highlight=False)
    elif rep:
        console.print(Text("no bare-run comparison: " + rep["unavailable"]), highlight=False)
    elif any(r["rule_id"] == "GD-OVERHEAD-BOUND" for r in result.get("recommendations") or []):
        console.print(Text("note: no run without the profiler to compare with (gpudiag profile makes one): the "
                           "overhead-bound numbers are as measured under tracing, which inflates host time"),
                      highlight=False)


def request_lines(result: dict) -> list[str]:
    """An inference run read per request (``result["inference"]``, gpudiag.analysis.steps.serving):
    latency percentiles and samples/s, start-up, and for generate() TTFT, TPOT and tokens/s."""
    inf = result.get("inference")
    if not inf:
        return []
    lat = inf["latency_ns"]
    n = inf.get("samples_per_step")
    batch = f" of {n} sample{'s' if n != 1 else ''}" if n else ""
    rate = f"; {inf['samples_per_s']:.1f} samples/s" if inf.get("samples_per_s") else ""
    lines = [f"per request ({inf['source']}, {inf['steps']} steps{batch}): latency p50 {fmt_ns(lat['p50'])}, "
             f"p90 {fmt_ns(lat['p90'])}, p99 {fmt_ns(lat['p99'])}{rate}"]
    if inf.get("startup_ns") is not None:
        warm = (f", then {inf['warmup_steps']} warm-up steps {fmt_ns(inf['warmup_ns'])}"
                if inf.get("warmup_ns") is not None else "")
        lines.append(f"start-up {fmt_ns(inf['startup_ns'])} before the first step (imports, model construction, "
                     f"weight upload){warm}: in no measured step and the base of no saving")
    else:
        lines.append("start-up: not recorded for this run (its status has no start-up time)")
    gen = inf.get("generation")
    if gen:
        lines.append(f"generate(): time to first token {fmt_ns(gen['ttft_ns'])}, time per output token "
                     f"{fmt_ns(gen['tpot_ns'])}, {gen['tokens_per_s']:.0f} tokens/s "
                     f"({gen['tokens_per_step']:.0f} tokens per call)")
        roof = gen.get("decode_roofline")
        if roof:
            lines.append(f"decode against the memory roofline: {fmt_ns(roof['floor_ns'])} per token to read "
                         f"{roof['bytes'] / 2**20:.0f} MiB (weights{' and KV cache' if roof['kv_included'] else ''}) "
                         f"at the HBM bandwidth; time per output token is {roof['tpot_over_floor']:.1f}x that")
    return lines


def compiled_text(result: dict) -> str | None:
    """One line on torch.compile and CUDA graphs: graphs run, Dynamo's graphs / breaks /
    recompilations, the compiled share of kernel time and how much of it maps to a module, and
    graph vs kernel launches per step. None when the run used neither."""
    parts = []
    compiled, launches = result.get("compiled"), result.get("launches_per_step") or {}
    if compiled:
        dynamo = compiled.get("dynamo") or {}
        if dynamo:
            parts.append(f"torch.compile: {dynamo['unique_graphs']} graphs, {dynamo['graph_breaks']} graph breaks, "
                         f"{dynamo['recompiles']} recompilations")
        if compiled.get("graphs"):
            parts.append(f"compiled kernels {fmt_pct(compiled['compiled_percent_of_kernel_time'])} of kernel time, "
                         f"{fmt_pct(compiled['module_percent'])} of it attributed to a module")
    if launches.get("graph_launches"):
        parts.append(f"{launches['graph_launches']:.0f} CUDA graph launches and {launches['kernel_launch_calls']:.0f} "
                     f"kernel launches per step ({launches['kernels_from_graphs']:.0f} of "
                     f"{launches['kernels']:.0f} kernels replayed from graphs)")
    return "; ".join(parts) or None


def render_compiled(result: dict, console: Console) -> None:
    text = compiled_text(result)
    if text:
        console.print(Text(text), highlight=False)


def chain_text(candidate: dict) -> str:
    """A fusion candidate's chain as the HTML report shows it: ``mul → pow → add``, or the summary
    of a long kernel sequence (:func:`gpudiag.renderers.labels.chain_summary`)."""
    from gpudiag.renderers.labels import chain_summary

    return chain_summary(candidate)


def saving_text(rec: dict) -> str:
    """A recommendation's GPU-time saving, and the step's bound when the host's launch time caps it
    (gpudiag.analysis.rules.host_floor): '11.4 ms (step ≤ 2.70 ms)'; a throughput gain as such:
    '2.0x samples/s at 2x batch'."""
    if rec.get("throughput_gain"):
        return ", ".join(f"{g:.1f}x samples/s at {k}x batch" for k, g in rec["throughput_gain"].items())
    text = fmt_ns(rec["saving_ns_per_step"])
    bound = rec.get("step_saving_bound_ns")
    if bound is not None and bound < 0.9 * rec["saving_ns_per_step"]:
        text += f" (step ≤ {fmt_ns(bound)})"
    return text


def reference_text(candidate: dict) -> str:
    """What to use for a candidate: its reference kernel, torch.compile for a known pattern with no
    kernel (BatchNorm + ReLU), or a dash."""
    if candidate.get("reference_kernel"):
        return candidate["reference_kernel"]
    return f"torch.compile ({candidate['compile_pattern']})" if candidate.get("compile_pattern") else "–"


KERNEL_SEQUENCE_NOTE = "candidates from the kernel sequence (no op ranges in this export): lower confidence"


def render_fusion(result: dict, console: Console, top: int = FUSION_TOP) -> None:
    """The top fusion candidates (chain, occurrences, GPU-time saving per step, reference kernel),
    with the overhead-bound note when the report has one; nothing when there is no candidate."""
    candidates = result.get("fusion_candidates") or []
    if not candidates:
        return
    table = Table(title=f"top {min(top, len(candidates))} of {len(candidates)} fusion candidates "
                        "(GPU time saved per step; report.html has them all)", show_header=True, header_style="bold")
    table.add_column("chain", overflow="fold", max_width=60)
    table.add_column("×/step", justify="right")
    table.add_column("saving/step", justify="right")
    table.add_column("reference kernel", overflow="fold")
    for c in candidates[:top]:  # names cut to NAME_WIDTH: folding a 10 MB one took minutes
        ops = [shorten(str(op), NAME_WIDTH // 2) for op in c.get("ops") or []]
        table.add_row(Text(shorten(chain_text({**c, "ops": ops}), 2 * NAME_WIDTH)), str(c["occurrences_per_step"]),
                      fmt_ns(c["saving_ns_per_step"]), Text(shorten(reference_text(c), NAME_WIDTH)))
    console.print(table)
    if result.get("fusion_source") == "kernel_sequence":  # no data flow: runs of kernels, bytes estimated from names
        console.print(Text(KERNEL_SEQUENCE_NOTE, style="yellow"), highlight=False)
    if result.get("fusion_note"):  # the saving is GPU time; an overhead-bound step will not get it back
        console.print(Text("note: ", style="yellow") + Text(result["fusion_note"]), highlight=False)
