"""How the stacks reach upstream (`make pr`): PLAN.md, ISSUE-SKELETON.md, COMMENT-KIT.md.

templates/port.toml says per stack what it becomes upstream (`upstream`: a pull request, a
comment on an open one, `comment_on`, or nothing: kept in the series and not sent, with `why`),
when a new contributor opens it (`order`: one open PR at a time), whether an issue goes first
(`issue_first`) and which upstream work it overlaps (`overlaps`). From that and what `make pr`
found per folder this module writes <work-dir>/pr/PLAN.md, an ISSUE-SKELETON.md in each
issue-first folder (the base tree's feature-request form, with placeholders and the facts to
cite) and, for a comment stack, COMMENT-KIT.md instead of DESCRIPTION-SKELETON.md (a kept stack
gets neither). The words of every issue, PR and comment are the human's: the tool drafts, proves
and explains; it never submits.
"""

from __future__ import annotations

import re
from pathlib import Path

import unidiff

from llamacpp_mla_port.errors import ProcessError
from llamacpp_mla_port.process import git
from llamacpp_mla_port.series.spec import Series, Stack, prose_file
from llamacpp_mla_port.upstreaming.pr_docs import DESCRIPTION

PLAN, ISSUE, COMMENT = "PLAN.md", "ISSUE-SKELETON.md", "COMMENT-KIT.md"
FORMS = ".github/ISSUE_TEMPLATE"
#: when the base tree has no feature-request form (upstream's 020-enhancement.yml sections)
FALLBACK_SECTIONS = (("Feature Description", True), ("Motivation", True), ("Possible Implementation", False))
#: the rpc comment kit: what the MSG_NOSIGNAL change and the reproducer are found by
RPC_DIR, NOSIGNAL, LOST_TEST = "ggml/src/ggml-rpc/", "MSG_NOSIGNAL", "test-rpc-multi-server"
REPRODUCER = re.compile(r"SIGPIPE|kill|lost", re.I)


# ------------------------------------------------------------------------------ PLAN.md
def plan_markdown(series: Series, results: dict[str, dict]) -> str:
    """The stacks in `order`: what to open, the issue first, overlaps, size and checks.
    `results` is make_pr's per-stack entry (ok, checks, added, removed, commits)."""
    lines = ["# Upstream plan: the stacks in the order a new contributor opens them", "",
             "A new contributor keeps one pull request open at a time (CONTRIBUTING.md): open "
             "the next PR only when the one before is merged or closed. Issues and comments are "
             "not PRs: open the issue of a later step early, so that interest can build.", "",
             "The words of every issue, PR and comment are yours. The tool drafts (the "
             "skeletons), proves (EVIDENCE.md) and explains; it never submits anything.", ""]
    sent = [st for st in series.in_order() if st.upstream != "kept"]
    kept = [st for st in series.in_order() if st.upstream == "kept"]
    for step, st in enumerate(sent, 1):
        lines += [f"## {step}. {st.name}: {what_to_open(st)}", ""] + _stack_lines(st, results.get(st.name))
    if kept:
        lines += ["## Kept back: in the series, not sent", "",
                  "These stacks stay in the series for the port's own use; they are not opened "
                  "upstream. Their folders hold the evidence, for the day that changes.", ""]
        for st in kept:
            lines += [f"### {st.name}: {what_to_open(st)}", ""] + _stack_lines(st, results.get(st.name))
    return "\n".join(lines)


def _stack_lines(st: Stack, r: dict | None) -> list[str]:
    """One stack's entry in PLAN.md: subject, why, issue, base, overlaps, size and checks."""
    lines = [f"- subject: `{st.title}`"]
    if st.why:
        lines.append(f"- why {'not a PR of ours' if st.upstream == 'comment' else 'it is kept back'}: {st.why}")
    if st.issue_first:
        lines.append(f"- first: an upstream issue ({st.name}/{ISSUE}); the PR waits until a maintainer is interested")
    if st.depends:
        lines.append(f"- based on: {', '.join(st.depends)} (open it once "
                     f"{'that has' if len(st.depends) == 1 else 'they have'} merged)")
    lines += [f"- overlaps {o.ref}: {o.relation}" for o in st.overlaps] or ["- overlaps: none known"]
    if st.first_step:
        lines.append(f"- a first step that can go alone, before the rest: series/{st.first_step[0]} "
                     f"(it applies alone on the base): {st.first_step[1]}")
    if r is None:
        return lines + ["- not built in this run (`--stack` chose others)", ""]
    skipped = [k for k, v in r.get("checks", {}).items() if v is None]
    return lines + [f"- size: {len(r.get('commits', []))} commit(s), +{r['added']}/-{r['removed']}",
                    f"- checks of {st.name}/: " + ("all that ran pass" if r["ok"] else
                                                   f"SOME FAIL ({st.name}/checks.json)")
                    + (f"; not run: {', '.join(skipped)}" if skipped else ""), ""]


def what_to_open(st: Stack) -> str:
    if st.upstream == "comment":
        return f"a comment on #{st.comment_on} ({st.name}/{COMMENT}), not a PR of ours"
    if st.upstream == "kept":
        return "kept in the series, not sent"
    return "an issue, then a PR" if st.issue_first else "a PR"


def write_plan(series: Series, results: dict[str, dict], pr_dir: Path) -> Path:
    path = pr_dir / PLAN
    path.write_text(plan_markdown(series, results))
    return path


# ------------------------------------------------------------------------ ISSUE-SKELETON.md
def parse_form(text: str) -> dict:
    """An issue form's name, title, checkbox labels and sections [(label, required)]: with
    PyYAML when it is installed, else from the form's `label:` lines."""
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        doc = yaml.safe_load(text) or {}
        form = {"name": doc.get("name", ""), "title": doc.get("title", ""), "checkboxes": [],
                "sections": [], "labels": list(doc.get("labels") or [])}
        for item in doc.get("body") or []:
            attrs = item.get("attributes") or {}
            if item.get("type") == "checkboxes":
                form["checkboxes"] += [o["label"] for o in attrs.get("options", []) if "label" in o]
            elif item.get("type") != "markdown" and attrs.get("label"):
                required = (item.get("validations") or {}).get("required")
                form["sections"].append((attrs["label"], bool(required)))
        return form
    form = {"name": "", "title": "", "checkboxes": [], "sections": [], "labels": []}
    kind = None
    for line in text.splitlines():
        m = re.match(r"^(name|title|labels):\s*(.*)$", line)
        if m:
            value = m.group(2).strip().strip('"')
            form[m.group(1)] = re.findall(r"[\w-]+", value) if m.group(1) == "labels" else value
        elif m := re.match(r"^\s*- type:\s*(\w+)", line):
            kind = m.group(1)
        elif m := re.match(r"^\s*- label:\s*(.*)$", line):
            form["checkboxes"].append(m.group(1).strip().strip('"'))
        elif (m := re.match(r"^\s+label:\s*(.*)$", line)) and kind not in ("markdown", "checkboxes"):
            form["sections"].append((m.group(1).strip().strip('"'), False))
        elif re.match(r"^\s+required:\s*true", line) and kind not in ("checkboxes", None) \
                and form["sections"]:
            form["sections"][-1] = (form["sections"][-1][0], True)
    return form


def feature_form(repo: git.Repo, base: str) -> tuple[str, dict] | None:
    """The base tree's feature-request issue form (labelled `enhancement`), or None."""
    try:
        names = git.run(repo, "ls-tree", "--name-only", f"{base}:{FORMS}").split()
    except ProcessError:
        return None
    for name in sorted(n for n in names if n.endswith((".yml", ".yaml")) and n != "config.yml"):
        form = parse_form((git.read_blob(repo, base, f"{FORMS}/{name}") or b"").decode())
        if "enhancement" in form["labels"] or re.search(r"feature|enhancement", name, re.I):
            return f"{FORMS}/{name}", form
    return None


def issue_skeleton(st: Stack, form: tuple[str, dict] | None, evidence: list[dict]) -> str:
    path, f = form or (None, {"name": "", "title": "", "checkboxes": [], "sections": list(FALLBACK_SECTIONS)})
    lines = [f"# Upstream issue for the `{st.name}` stack: a skeleton, not an issue", "",
             "The words are yours: replace every <...>, delete the facts section, and open "
             "the issue yourself (the tool submits nothing; the form forbids pasted model output).",
             "", (f"Form: `{path}` ({f['name']})" if path else
                  f"Form: none in the base tree ({FORMS}/): a minimal section list"), "",
             f"Title: {f['title'] or ''}<your title; the stack's subject is `{st.title}`>", ""]
    if f["checkboxes"]:
        lines += ["Confirm each yourself:", "", *[f"- [ ] {c}" for c in f["checkboxes"]], ""]
    for label, required in f["sections"]:
        lines += [f"## {label}" + (" (required)" if required else ""), "", "<your words>", ""]
    lines += ["## Facts to cite (not part of the issue: delete before opening it)", "",
              f"- stack: {st.name}, subject `{st.title}`",
              f"- summary ({prose_file(st.name)}): {st.summary or '(none)'}",
              *[f"- {fact}" for fact in st.issue_facts],
              *[f"- overlaps {o.ref}: {o.relation}" for o in st.overlaps],
              "- evidence (EVIDENCE.md in this folder: the commands and this run's results):",
              *[f"  - {e['claim']} [{e.get('status', 'not run')}]" for e in evidence], ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------ COMMENT-KIT.md
def _hunks(patches: list[Path], want) -> list[tuple[str, str]]:
    """(path, hunk text) of every hunk `want(path, hunk)` picks, in patch order."""
    out = []
    for p in patches:
        for pf in unidiff.PatchSet(p.read_text()):
            out += [(pf.path, str(h)) for h in pf if want(pf.path, h)]
    return out


def _added(h) -> str:
    return "".join(line.value for line in h if line.is_added)


def nosignal_hunks(patches: list[Path]) -> list[tuple[str, str]]:
    """The ggml-rpc hunks whose added lines carry MSG_NOSIGNAL, and those that use a name
    it is assigned to (`RPC_SEND_FLAGS = MSG_NOSIGNAL`: the send that passes it)."""
    rpc = lambda path, h: path.startswith(RPC_DIR)          # noqa: E731
    first = _hunks(patches, lambda path, h: rpc(path, h) and NOSIGNAL in _added(h))
    names = {n for _, text in first for n in re.findall(rf"(\w+)\s*=\s*{NOSIGNAL}\b", text)}
    uses = re.compile(rf"\b({'|'.join(map(re.escape, sorted(names)))})\b") if names else None
    return _hunks(patches, lambda path, h: rpc(path, h) and (
        NOSIGNAL in _added(h) or (uses is not None and bool(uses.search(_added(h))))))


def _diff(hunks: list[tuple[str, str]], what: str) -> list[str]:
    if not hunks:
        return [f"Not found: no hunk of this stack's patches/ carries {what}. Check the stack, "
                "or write that part of the comment by hand.", ""]
    lines, last = ["```diff"], None
    for path, text in hunks:
        if path != last:
            lines += [f"--- a/{path}", f"+++ b/{path}"]
            last = path
        lines.append(text.rstrip("\n"))
    return lines + ["```", ""]


def comment_kit(st: Stack, patches: list[Path], evidence: list[dict], subjects: list[str],
                measurements: str = "") -> str:
    """COMMENT-KIT.md for a stack that becomes a comment on upstream PR `st.comment_on`: a stack
    with upstream's benchmarks (a [bench] table) offers its measurements and test cases
    (measurement_kit); the rpc stack offers its fix, a reproducer and its test."""
    if st.bench is not None:
        return measurement_kit(st, patches, evidence, measurements)
    pr = f"#{st.comment_on}"
    replaced = [f"`{s}` (series/{slug})" for slug, s in zip(st.commits, subjects) if not s.startswith("tests :")]
    repro = [e for e in evidence if REPRODUCER.search(e["claim"])]
    lines = [f"# A comment on upstream PR {pr}: the `{st.name}` stack's kit", "",
             f"The `{st.name}` stack is not opened as a pull request: upstream PR {pr} does the "
             "same, and CONTRIBUTING.md asks to comment on an existing PR rather than open a "
             "duplicate. This kit holds what the comment can offer; the words are yours, and the "
             "tool posts nothing.", "",
             f"Our tree keeps the stack (patches/, squashed.patch) and its RPC fault behaviour "
             f"and tests. When {pr} lands it is expected to replace "
             + (", ".join(replaced) or "the stack's fix") + "; the stack then shrinks to what "
             f"{pr} lacks.", "",
             "## 1. The reproducer: a client whose RPC server is killed", ""]
    for e in repro:
        lines += [f"- {e['claim']}", "", "```sh", e["command"], "```", ""]
    if not repro:
        lines += ["Not found: no evidence claim of this stack mentions SIGPIPE or a killed "
                  f"server ({prose_file(st.name)}).", ""]
    lines += [f"## 2. The {NOSIGNAL} change (the hunks of patches/ that carry it)", "",
              "These hunks also hold lines of the stack's other changes; offer only the "
              f"{NOSIGNAL} / SO_NOSIGPIPE part.", ""]
    lines += _diff(nosignal_hunks(patches), NOSIGNAL)
    lines += [f"## 3. The test: `{LOST_TEST} --lost` (upstream's harness)", ""]
    lines += _diff(_hunks(patches, lambda path, h: LOST_TEST in path), f"the {LOST_TEST} case")
    lines += ["## 4. Before and after (this run's evidence)", ""]
    for e in repro:
        tail = (e.get("output_tail") or "").strip().splitlines()[-8:]
        lines += [f"- {e['claim']}: **{e.get('status', 'not run')}**"
                  + (f" (exit {e['rc']})" if "rc" in e else "")
                  + (f"; {e['note']}" if e.get("note") else "")]
        lines += ["", "```", *tail, "```", ""] if tail else [""]
    lines += ["## 5. Later, and separately", "",
              "The connect/HELLO time-out (GGML_RPC_CONNECT_TIMEOUT) and the refusal of a "
              f"foreign peer are not part of the comment: after {pr} lands, they become a "
              "separate change, after an issue, with their documentation (tools/rpc/README.md).",
              "", "The upstream work this stack overlaps (templates/port.toml):", "",
              *[f"- {o.ref}: {o.relation}" for o in st.overlaps], ""]
    return "\n".join(lines)


def measurement_kit(st: Stack, patches: list[Path], evidence: list[dict], measurements: str) -> str:
    """The kit of a stack whose change an open upstream PR reworks: what we measured there (the
    upstream-bench and harness-diff sections of EVIDENCE.md), our test cases (the stack's hunks
    in tests/), the project's checks; the stack's own change only for reference."""
    pr = f"#{st.comment_on}"
    lines = [f"# A comment on upstream PR {pr}: the `{st.name}` stack's kit", "",
             f"The `{st.name}` stack is not opened as a pull request: upstream PR {pr} changes the "
             "same code, and a second PR on it would be a twin (CONTRIBUTING.md asks to comment on "
             "the existing PR). This kit holds what a comment can offer there: measurements and test "
             "cases. The words are yours, and the tool posts nothing.", "",
             "## 1. How the two relate", "",
             *([f"- why a comment: {st.why}"] if st.why else []),
             *[f"- {o.ref}: {o.relation}" for o in st.overlaps], "",
             "## 2. Test cases to offer (the stack's hunks in tests/)", ""]
    lines += _diff(_hunks(patches, lambda path, h: path.startswith("tests/")), "a test case")
    lines += ["## 3. Measurements, base against this stack (upstream's own tools)", "",
              "Each table's caption says its weights, layers, threads and machine. The same commands "
              f"run on {pr}'s branch show what it does in these cases.", ""]
    # EVIDENCE.md's sections, one heading level down, under this kit's own heading
    lines += [re.sub(r"^(#+) ", r"#\1 ", measurements.strip(), flags=re.M) if measurements.strip() else
              "Not run: `make upstream-bench` (or `make pr`) makes these tables.", ""]
    lines += ["## 4. The project's own checks (this run)", ""]
    for e in evidence:
        lines += [f"- {e['claim']}: **{e.get('status', 'not run')}**", f"  `{e['command']}`"]
    lines += ["", "## 5. The stack's change, for reference only", "",
              f"patches/ and squashed.patch in this folder. Offer it only if {pr}'s author asks for "
              "it: the comment is about the cases it is measured and tested in.", ""]
    return "\n".join(lines)


def write_stack_docs(repo: git.Repo, base: str, st: Stack, folder: Path, evidence: list[dict],
                     subjects: list[str], measurements: str = "") -> list[str]:
    """The plan's files in one PR folder: ISSUE-SKELETON.md when an issue goes first; for a
    comment stack COMMENT-KIT.md in place of DESCRIPTION-SKELETON.md, and a CHECKLIST.md note;
    for a kept stack no PR description, and a CHECKLIST.md note. `measurements` is the upstream
    benchmark and test sections of EVIDENCE.md (a measurement kit quotes them)."""
    written = []
    if st.issue_first:
        (folder / ISSUE).write_text(issue_skeleton(st, feature_form(repo, base), evidence))
        written.append(ISSUE)
    note = ""
    if st.upstream == "comment":
        from llamacpp_mla_port.series.gitseries import read_series
        (folder / COMMENT).write_text(comment_kit(st, read_series(folder / "patches"), evidence,
                                                  subjects, measurements))
        written.append(COMMENT)
        note = (f"> Not a PR: this stack becomes a comment on #{st.comment_on} ({COMMENT}). "
                "The boxes below apply only if it becomes a PR.")
    elif st.upstream == "kept":
        note = (f"> Not sent: this stack stays in the series and is not opened upstream ({st.why}). "
                "The boxes below apply only if it is sent one day.")
    if note:
        (folder / DESCRIPTION).unlink(missing_ok=True)      # no PR, so no PR description
        check = folder / "CHECKLIST.md"
        if check.is_file():
            check.write_text(note + "\n\n" + check.read_text())
    return written
