"""What a retrain says: its closing line, why nothing was accepted, a push that failed, and the run's markdown
summary."""

from __future__ import annotations

from pathlib import Path

from tqc.retraining.data_versions import push_command
from tqc.retraining.inbox import Incoming, repeat_outcome
from tqc.retraining.pending import Trained
from tqc.retraining.staging import Staged, file_reason


def why_nothing_was_accepted(staged: Staged, repeats: list[Incoming], quarantine: Path) -> str:
    """One line for the log: repeats, unusable files, and quarantined rows with the first one's line and reason."""
    parts = [f"{len(repeats)} repeat(s)"] if repeats else []
    unusable = staged.unusable
    parts += [f"{len(unusable)} unusable file(s)"] if unusable else []
    parts += [_still_changing(staged)] if staged.still_changing else []
    rows = staged.rows_quarantined
    if rows:
        first = rows[0]
        parts.append(f"{len(rows)} row(s) quarantined to {quarantine}, e.g. {first['file']}, line {first['line']}: "
                     f"{first['reason']}")
    # otherwise, e.g. a catalog file that repeats known classes as the catalog has them: each file's own account
    return "; ".join(parts or [f"{Path(o.file).name}: {o.reason or 'added nothing'}" for o in staged.outcomes])


def _still_changing(staged: Staged) -> str:
    return (f"{len(staged.still_changing)} file(s) changed after pick-up, left in the inbox for the next run: "
            + ", ".join(Path(f).name for f in staged.still_changing))


def closing_line(staged: Staged, promotion: dict, committed: dict, quarantine: Path) -> str:
    """The flow's last log line after a training: what was added and quarantined, the gate's decision with its reasons,
    and the data version's .dvc files, which no commit records until a person commits them."""
    rows, unusable = staged.rows_quarantined, staged.unusable
    left_out = ([f"{len(rows)} row(s) quarantined to {quarantine}"] if rows else []) + (
        [f"{len(unusable)} unusable file(s)"] if unusable else []) + (
        [_still_changing(staged)] if staged.still_changing else [])
    line = (f"retrain: {staged.accepted - staged.new_classes} rows and {staged.new_classes} classes added"
            + (f" ({'; '.join(left_out)})" if left_out else "")
            + f"; {'promoted' if promotion['promoted'] else 'champion kept'}: {'; '.join(promotion['reasons'])}")
    versions = committed.get("dvc", {}).get("added") or []
    if versions:
        line += (f". New data version: {', '.join(versions)}; commit it to git: until then no commit records it, and "
                 "`dvc exp run` unstages it")
    if committed.get("dvc", {}).get("push_failed"):
        line += f"; not on the DVC remote (the push failed): `{push_command(versions)}`"
    return line


def push_failure(result: dict) -> str | None:
    """One line for a run whose new data version is committed but not on the DVC remote (`dvc_record`'s
    `push_failed`), or whose push of the last run's unpushed version failed again (`pending_dvc`,
    `push_pending_version`'s) and which committed no newer one (a newer one holds its rows, and its own push is what
    this run says): what stands, DVC's reason and the command that pushes it; None when no push failed."""
    dvc, pending = result.get("dvc", {}), result.get("pending_dvc", {})
    if dvc.get("push_failed"):
        judged = (f" and its challenger {'promoted' if result['promoted'] else 'judged (champion kept)'}"
                  if "promoted" in result else "")
        return _unpushed_line(f"the new data version ({', '.join(dvc['added'])}) is committed{judged}, but it is not",
                              dvc)
    if pending.get("push_failed") and not dvc.get("added"):
        return _unpushed_line(f"the data version the last run committed ({', '.join(pending['added'])}) was pushed "
                              "again, but it is still not", pending)
    return None


def _unpushed_line(what: str, dvc: dict) -> str:
    return (f"{what} on the DVC remote, so no other checkout can `dvc pull` it: {dvc['push_failed']}; push it by hand "
            f"with `{push_command(dvc['added'])}` before another retrain changes those files")


def _cell(text: str) -> str:
    """Text for a markdown table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _data_version_lines(committed: dict) -> list[str]:
    """The summary's line on the new data version: on the DVC remote, in this checkout's cache only, or not on the
    remote because the push failed (the UI's artifact says it where the run's logs are not read)."""
    dvc = committed.get("dvc", {})
    versions = dvc.get("added") or []
    if not versions:
        return []
    named = ", ".join(f"`{v}`" for v in versions)
    if dvc.get("push_failed"):
        return ["", f"New data version: {named}; **not on the DVC remote**, the push failed: {_cell(dvc['push_failed'])}. "
                    f"Push it by hand: `{push_command(versions)}`."]
    where = "on the DVC remote" if dvc.get("pushed") else "in this checkout's DVC cache only (no remote, or retrain.push off)"
    return ["", f"New data version: {named}, {where}."]


def _class_changes_table(changes: list[dict]) -> list[str]:
    """The classes whose validation F1 moved most, worst news and best alike (promote's `class_changes`)."""
    if not changes:
        return []
    return ["", "## Classes that moved most (validation F1)", "", "| class | questions | champion | challenger | Δ |",
            "| --- | --- | --- | --- | --- |"] + [
        f"| {_cell(c['class_id'])} | {c['support']} | {c['champion_f1']:.3f} | {c['challenger_f1']:.3f} | "
        f"{c['difference']:+.3f} |" for c in changes]


def summary_markdown(staged: Staged, promotion: dict | None, trained: Trained | None, repeats: list[Incoming] = (),
                     committed: dict | None = None) -> str:
    """The flow's Prefect artifact: what came in (`repeats` too), the data version `committed` made (`commit`'s result)
    and whether the DVC remote has it, and the challenger against the champion."""
    lines = ["# Retrain", "", "| file | kind | outcome | read | accepted | quarantined | reason |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {Path(o.file).name} | {o.kind} | {o.outcome} | {o.read} | {o.accepted} | {o.quarantined} | "
              f"{_cell(file_reason(o, staged))} |" for o in [*staged.outcomes, *map(repeat_outcome, repeats)]]
    lines += [f"| {_cell(Path(f).name)} | | left in the inbox | | | | changed after it was picked up: read next run |"
              for f in staged.still_changing]
    lines += ["", f"Accepted rows: **{staged.accepted - staged.new_classes}**; new classes: **{staged.new_classes}**."]
    lines += _data_version_lines(committed or {})
    if trained and trained.refreshed_from:
        champion = trained.refreshed_from
        lines += ["", f"Refreshed, not trained: version {champion.version}'s encoder with the grown labeled questions "
                      "as its exemplars" + ("." if champion.rule == "exemplars" else
                                            f" (version {champion.version} serves the {champion.rule} rule).")]
    if promotion and trained and promotion.get("challenger_version") is None:  # tracking off: no registry to judge in
        lines += ["", "**Not promoted**:", ""] + [f"- {reason}" for reason in promotion["reasons"]]
    elif promotion and trained:
        validation = promotion.get("validation", {})
        champion = validation.get("champion_accuracy")
        challenger = validation.get("challenger_accuracy")
        lines += ["", "## Challenger vs champion (validation)", "", "| metric | champion | challenger | Δ |", "| --- | --- | --- | --- |"]
        if champion is not None:
            lines.append(f"| accuracy | {champion:.4f} | {challenger:.4f} | {challenger - champion:+.4f} |")
            lines.append(f"| tail macro-F1 | {promotion['champion_tail_macro_f1']:.4f} | "
                         f"{promotion['challenger_tail_macro_f1']:.4f} | "
                         f"{promotion['challenger_tail_macro_f1'] - promotion['champion_tail_macro_f1']:+.4f} |")
        elif challenger is None:  # every validation question was one a model learnt from: nothing was judged
            lines.append("| accuracy | (not judged) | (not judged) | |")
        else:
            absent = "(none)" if promotion.get("champion_version_before") is None else "(not comparable)"
            lines.append(f"| accuracy | {absent} | {challenger:.4f} | |")
        lines += ["", f"**{'Promoted' if promotion['promoted'] else 'Not promoted'}**: "
                  f"version {promotion['challenger_version']}; champion is now version {promotion['champion_version_after']}.", ""]
        lines += [f"- {reason}" for reason in promotion["reasons"]]
        lines += _class_changes_table(promotion.get("class_changes", []))
    return "\n".join(lines) + "\n"

