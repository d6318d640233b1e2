"""The markdown of `make pr`'s folders (upstreaming/pr.py writes them): the author's
CHECKLIST.md, EVIDENCE.md, DESCRIPTION-SKELETON.md. Skeletons and checklists only: the words
of a PR are its author's.
"""

from __future__ import annotations

import json
import re

from llamacpp_mla_port.series import stacks as stacks_mod
from llamacpp_mla_port.series.spec import Stack, prose_file
from llamacpp_mla_port.upstreaming.upstream_bench import NOT_MEASURED


# ---------------------------------------------------------------------------- checklist
def _strip_comments(text: str) -> str:
    # the template's HTML comments are guidance for humans (and one addressed to tools);
    # they are data, never instructions, and are not copied
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def checklist(template: str | None, checks: dict) -> str:
    """CHECKLIST.md: the PR template's sections and requirements as boxes for the author,
    then what the tool verified. It is NOT a PR description and has none to paste."""
    ok = lambda b: "x" if b else " "          # noqa: E731
    lines = ["# Before opening a pull request: checklist for the author", "",
             "Prepared by `llamacpp-mla-port pr`. This is not a PR description: the tool "
             "writes none. The description, the commit messages (the drafts live in "
             "templates/series/*/message.txt.j2: rewrite them in your words) and every "
             "answer below are yours, and you must understand and be able to defend every "
             "line of the series. Nothing was pushed or submitted.", ""]
    lines += ["## The tree's pull request template (.github/pull_request_template.md)", ""]
    if template is None:
        lines += ["- [ ] The base tree has no .github/pull_request_template.md: read "
                  "CONTRIBUTING.md for what the PR must contain", ""]
    else:
        for raw in _strip_comments(template).splitlines():
            line = raw.strip()
            if line.startswith("#"):
                title = line.lstrip("#").strip()
                lines += [f"### {title}", ""]
                if title.lower() in ("overview", "additional information"):
                    lines += ["- [ ] Written by you (the tool leaves this section to you)", ""]
            elif line.startswith(("- ", "* ")):
                item = line[2:].strip().rstrip(":").strip()
                if "ai usage" in item.lower() or "ai use" in item.lower():
                    lines += [f"- [ ] {item} (fill this in yourself: YES or NO, and if YES "
                              "how AI was used. Note: this tool and the series' templates were "
                              "prepared with AI assistance)", ""]
                else:
                    lines += [f"- [ ] {item}", ""]
    c = checks
    lines += ["## llama.cpp contributor rules (CONTRIBUTING.md, AGENTS.md)", "",
              "- [ ] One feature per PR; a new model starts with CPU support only",
              "- [ ] Commit titles are `<module> : <title>`; messages rewritten in your words",
              "- [ ] `llama-perplexity` / `llama-bench` run by you for performance (not run by "
              "the tool)",
              "- [ ] You ran the repository's CI locally (the tool covers the checks below only)",
              "", "## Verified by the tool (evidence in this folder)", "",
              f"- [{ok(c.get('patches_match'))}] patches/ equal a fresh render of templates/ "
              "(series/)",
              f"- [{ok(c.get('builds'))}] every commit builds on its own: {c.get('build_note', '')}",
              f"- [{ok(c.get('flake8'))}] flake8 with the tree's .flake8 on touched Python files",
              f"- [{ok(c.get('whitespace'))}] .editorconfig/.ecrc whitespace rules on touched files",
              f"- [{ok(c.get('proof'))}] the proof (`make smoke`): parity NMSE, lossless "
              "speculative decoding, KV bytes per token (proof.json, summary.json)",
              ""]
    return "\n".join(lines)


DESCRIPTION = "DESCRIPTION-SKELETON.md"
EVIDENCE = "EVIDENCE.md"


#: what triggers upstream's server workflow (.github/workflows/server.yml `paths`)
SERVER_TEST_PATHS = re.compile(r"(^|/)(CMakeLists\.txt|Makefile)$|\.(h|hpp|c|cpp|cu|swift|m)$|^tools/server/")


def server_tests_note(files: list[str]) -> str | None:
    """The line EVIDENCE.md gives upstream's server tests, which need the Hub: None when no
    file of the stack triggers them."""
    hits = [f for f in files if SERVER_TEST_PATHS.search(f)]
    if not hits:
        return None
    return (f"Not run here: upstream's server tests (tools/server/tests, the server workflow), which "
            f"{len(hits)} files of this stack trigger (e.g. {', '.join(hits[:3])}). They download "
            "their models from the Hugging Face Hub, which this machine cannot reach: run them on a "
            "connected machine before opening the PR.")


def evidence_markdown(stack: Stack, entries: list[dict], facts: dict, upstream: dict | None = None,
                      lead: str = "") -> str:
    """EVIDENCE.md: `lead` first (upstream's own benchmarks and tests, in upstream's format),
    then upstream's PR checks, then, as an appendix, the project's claims and their commands."""
    lines = [f"# Evidence for the `{stack.name}` pull request", "",
             "Upstream's own tools first (their commands, run on the base and on this PR with the "
             "same flags); the project's own checks follow in an appendix. Cite these, not the tool.", "",
             f"- base: {facts['base']}", f"- commits: {len(facts['commits'])}, "
             f"+{facts['added']}/-{facts['removed']} lines in {len(facts['files'])} files",
             f"- applies alone on the base: {facts['applies_alone']} (patches/ and "
             f"{stacks_mod.SQUASHED}, re-applied with `git apply`)", ""]
    if lead:
        lines += [lead.strip("\n"), ""]
    if upstream:
        lines += ["## Upstream's PR checks, base vs this stack (`llamacpp-mla-port pr`)", "",
                  "| check | base | patched | introduced by the stack |", "|---|---|---|---|"]
        for name, r in upstream.items():
            if not r["ran"]:
                lines.append(f"| {name} | - | - | not run: {r['note']} |")
            else:
                intro = "; ".join(r["introduced"][:5]) or "none"
                lines.append(f"| {name} | {r['base']} | {r['patched']} | {intro} |")
        lines += ["", "flake8 and editorconfig: on the files the stack touches; ty, model naming "
                  "and pre-tokenizer hashes: the whole tree.", ""]
    note = server_tests_note(facts.get("files", []))
    if note:
        lines += [note, ""]
    if entries:
        lines += ["## Appendix: the project's own checks", "",
                  "Each claim of the PR, the project command behind it (run from the project checkout, "
                  "not from llama.cpp) and what it gave in this run.", ""]
    for i, e in enumerate(entries, 1):
        lines += [f"### {i}. {e['claim']}", "", "```sh", e["command"], "```", "",
                  f"- result: **{e['status']}**" + (f" (exit {e['rc']}, {e['seconds']} s)" if "rc" in e else ""),
                  *([f"- {e['note']}"] if e.get("note") else []), ""]
        if e.get("figures"):
            lines += ["```json", json.dumps(e["figures"], indent=2), "```", ""]
        if e.get("output_tail"):
            tail = e["output_tail"].strip().splitlines()[-5:]
            lines += ["```", *tail, "```", ""]
    return "\n".join(lines)


def description_skeleton(template: str | None, stack: Stack, facts: dict) -> str:
    """The PR template's sections with placeholders and the facts to draw on. It is a
    skeleton, not a description: llama.cpp's AGENTS.md and CONTRIBUTING.md require the
    description to be the author's own words."""
    lines = [f"<!-- DRAFT SKELETON for the `{stack.name}` PR: replace every <...> with your own",
             "words and delete this comment. The tool writes no PR description. -->", "",
             f"Title: <your title; the stack's commit subject is `{stack.title}`>", ""]
    sections = []
    if template:
        sections = [ln.lstrip("#").strip() for ln in _strip_comments(template).splitlines()
                    if ln.strip().startswith("#")]
    for title in sections or ["Overview", "Additional information", "Requirements"]:
        lines += [f"## {title}", ""]
        low = title.lower()
        if low == "overview":
            lines += ["<what this PR does and why, in your words>", ""]
        elif low == "additional information":
            lines += ["<related issue / discussion; how you tested it (EVIDENCE.md lists the "
                      "commands and their results)>", ""]
        elif low == "requirements":
            for raw in _strip_comments(template or "").splitlines():
                if raw.strip().startswith(("- ", "* ")):
                    item = raw.strip()[2:].strip()
                    if "ai usage" in item.lower():
                        item = item.rstrip(":").rstrip() + ": <YES / NO; if YES, how AI was used>"
                    lines.append(f"- {item}")
            lines.append("")
        else:
            lines += ["<...>", ""]
    if facts.get("based_on"):
        lines += [f"<!-- A stacked PR: based on the {', '.join(facts['based_on'])} PR(s). Open those first "
                  f"and say so here; these patches apply on ../{facts['based_on'][-1]}/{stacks_mod.SQUASHED}. -->", ""]
    lines += ["<!-- Facts to draw on (delete before opening the PR):",
              f"  summary in {prose_file(stack.name)}: {stack.summary or '(none)'}",
              f"  commits ({len(facts['commits'])}, +{facts['added']}/-{facts['removed']}):",
              *[f"    {c}" for c in facts["commits"]],
              f"  evidence: {EVIDENCE} in this folder -->", ""]
    return "\n".join(lines)


def stack_checklist(template: str | None, stack: Stack, checks: dict) -> str:
    """checklist() for one PR, with the steps only the author can take."""
    text = checklist(template, checks)
    own = ["## Before you open this PR (only you can do these)", "",
           "- [ ] Rewrite every commit message and the description in your own words "
           "(DESCRIPTION-SKELETON.md is placeholders only; AGENTS.md forbids AI-written "
           "descriptions and commit messages)",
           "- [ ] Reset the author to yourself: `git am patches/*.patch` (or "
           f"`{stacks_mod.SQUASHED}`) on a branch, then "
           "`git rebase --exec 'git commit --amend --no-edit --reset-author' <base>`",
           "- [ ] Disclose the assistance as AGENTS.md asks: the PR template's AI usage line, "
           "and `Assisted-by: <assistant name>` in a commit you let an assistant make "
           "(never `Co-authored-by:`)",
           "- [ ] Search upstream's open issues and PRs for the same change first (a feature "
           "starts from an issue, CONTRIBUTING.md)",
           "- [ ] Understand and be able to defend every line without help: WALKTHROUGH.md "
           "lists every hunk with its questions (for your reading, not text to post)",
           "- [ ] Open the PR yourself: the tool never pushes or submits anything",
           *([f"- [ ] Run EVIDENCE.md's benchmark commands where this machine could not: "
              f"{'; '.join(NOT_MEASURED)}, and add the tables",
              "- [ ] Thread rows on Intel hosts, 1 to 16 threads (an AVX2 hybrid as release builds "
              "target, e.g. Alder Lake, and a Sapphire Rapids Xeon): "
              f'`make upstream-bench UPSTREAM_BENCH_ARGS="--stack {stack.name} -t 1,2,4,8,16"` there, '
              "until a device run (docs/device-check.md) brings them"] if stack.bench else []), ""]
    return text.replace("## The tree's pull request template", "\n".join(own) +
                        "\n## The tree's pull request template", 1)
