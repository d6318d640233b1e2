"""The port description: templates/port.toml, one folder per commit in templates/series/, and
each PR stack's prose, issue facts and evidence in templates/stacks/<name>.md.

Pure data loading and validation; rendering is series/render.py's job.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_mla_port.errors import PortDescriptionError

PLACEMENTS = ("after", "before", "replace", "create")
_FOLDER = re.compile(r"^\d{2}-[a-z0-9][a-z0-9-]*$")
_CHANGE_KEYS = {"file", "anchor", "within", "within_end", "placement", "template", "regex",
                "vars", "with_commit", "without_commit"}
_COMMIT_KEYS = {"vars", "change", "stack"}
_STACK = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_STACK_KEYS = {"title", "depends", "upstream", "comment_on", "order",
               "issue_first", "overlaps", "bench", "first_step", "why"}
#: templates/<PROSE_DIR>/<stack>.md: a stack's prose, what it changes and why (its `summary`),
#: then these sections, each at most once, in this order (its `issue_facts`, its `evidence`)
PROSE_DIR = "stacks"
_SECTIONS = ("## Issue facts", "## Evidence")
#: [stacks.NAME.bench]: what upstream's own benchmarks run on the base and the stack
_BENCH_KEYS = {"types": list, "prompts": str, "args": list, "ops": list, "params": str, "shapes": list,
               "n_layer": int, "reps": int, "batched": list, "kld": list, "kld_reference": list}
BENCH_TYPES = ("f16", "bf16", "q8_0", "q4_0")
_OVERLAP_KEYS = {"ref", "relation"}
#: what a stack becomes upstream: its own pull request, a comment on an open one, or nothing
#: yet (kept in the series for the port's own use, not sent)
UPSTREAM_FORMS = ("pr", "comment", "kept")
_REF = re.compile(r"^#[1-9]\d*$")
#: upstream's commit title, `<module> : <title>`: the one rule that render and the PR kit's style
#: check (upstreaming/style.py) apply
TITLE = re.compile(r"^(?P<module>[a-z0-9][a-z0-9_.+/-]*) : (?P<title>\S.*)$")


@dataclass(frozen=True)
class Change:
    file: str
    placement: str
    template: str            # path relative to templates/
    anchor: str | None = None
    within: str | None = None
    within_end: str | None = None
    regex: bool = False
    vars: dict = field(default_factory=dict)
    origin: str = ""         # "series/NN-slug/commit.toml change #i", for messages
    # a change for one form of its stack: rendered only when that earlier commit is (with_) or
    # is not (without_) in the series being rendered (a stack alone on the base, or the series)
    with_commit: str | None = None
    without_commit: str | None = None

    def wanted(self, present: "set[str] | frozenset[str]") -> bool:
        """Whether this change belongs to a rendering whose commits are `present`."""
        return ((self.with_commit is None or self.with_commit in present)
                and (self.without_commit is None or self.without_commit not in present))


@dataclass(frozen=True)
class Commit:
    slug: str                # folder name, e.g. "10-gguf-py-dflash-mla-tensors"
    message_template: str    # path relative to templates/
    changes: tuple[Change, ...]
    vars: dict = field(default_factory=dict)
    stack: str = ""          # the pull request (port.toml [stacks.NAME]) this commit goes in


@dataclass(frozen=True)
class Evidence:
    claim: str               # what the PR says
    command: str             # what shows it, run from the project checkout


@dataclass(frozen=True)
class Overlap:
    ref: str                 # open (or deliberate) upstream work, "#27478"
    relation: str            # one line: how the stack relates to it


@dataclass(frozen=True)
class Bench:
    """[stacks.NAME.bench]: the stack's evidence in upstream's format (upstreaming/upstream_bench.py)."""
    types: tuple[str, ...]            # GGUF types of the models (BENCH_TYPES)
    prompts: str = "1,2,3,4,5,6,7,8,12,16,32,64,512"    # llama-bench -p
    args: tuple[str, ...] = ()        # more llama-bench options, e.g. ("-fa", "1", "-d", "0,4096")
    ops: tuple[str, ...] = ()         # test-backend-ops perf -o OP
    params: str = ""                  # test-backend-ops perf -p REGEX (the cases of those ops)
    shapes: tuple[str, ...] = ("llama-3.2-3b",)   # fixtures/standard_model.SHAPES, a model of each
    n_layer: int | None = None        # layers of the standard-shape model, when not the run's setting
    reps: int | None = None           # llama-bench -r, when not the run's setting
    batched: tuple[str, ...] = ()     # llama-batched-bench options (-npp, -ntg, -npl, -kvu ...): run when set
    kld: tuple[str, ...] = ()         # llama-perplexity options of the KL divergence, stack against base
    kld_reference: tuple[str, ...] = ()   # added to `kld` for the base's own reference run


@dataclass(frozen=True)
class Stack:
    """One pull request upstream would get: series commits, in series order, that apply
    alone on the pinned base (port.toml [stacks.NAME])."""
    name: str
    title: str               # the squashed commit's subject, `<module> : <title>`
    commits: tuple[str, ...]  # commit slugs
    summary: str = ""        # templates/stacks/<name>.md, each paragraph on one line
    evidence: tuple[Evidence, ...] = ()     # its `## Evidence`
    depends: tuple[str, ...] = ()   # stacks (earlier in port.toml) this PR is based on
    # the plan (upstreaming/plan.py, PLAN.md); never part of the patch text
    #: "pr": a pull request of ours; "comment": a comment on `comment_on`; "kept": in the series, not sent upstream
    upstream: str = "pr"
    comment_on: int | None = None   # the open upstream PR a "comment" stack contributes to
    why: str = ""            # why a "comment" or "kept" stack is not a PR of ours (PLAN.md)
    order: int = 0           # when a new contributor (one open PR at a time) opens it, from 1
    issue_first: bool = False        # a feature: an upstream issue comes before the PR
    overlaps: tuple[Overlap, ...] = ()
    issue_facts: tuple[str, ...] = ()   # its `## Issue facts`: what the issue cites (ISSUE-SKELETON.md)
    bench: Bench | None = None       # upstream's benchmarks, base against the stack
    #: (commit slug, why): one of its commits that upstream can take first, as a PR of its own
    first_step: tuple[str, str] | None = None


@dataclass(frozen=True)
class Series:
    root: Path
    vars: dict
    author_name: str
    author_email: str
    date: str
    branch: str
    commits: tuple[Commit, ...]
    stacks: tuple[Stack, ...] = ()

    def stack(self, name: str) -> Stack:
        if st := next((st for st in self.stacks if st.name == name), None):
            return st
        raise PortDescriptionError(f"no PR stack {name!r} in templates/port.toml",
                                   f"stacks: {', '.join(s.name for s in self.stacks)}")

    def only(self, *stacks: Stack) -> "Series":
        """This series reduced to these stacks' commits, in series order."""
        slugs = {s for st in stacks for s in st.commits}
        return dataclasses.replace(self, commits=tuple(c for c in self.commits if c.slug in slugs))

    def in_order(self) -> tuple[Stack, ...]:
        """The stacks in the order a new contributor opens them (port.toml `order`)."""
        return tuple(sorted(self.stacks, key=lambda st: st.order))

    def slugs(self) -> tuple[str, ...]:
        return tuple(c.slug for c in self.commits)

    def files(self) -> set[str]:
        """Every upstream file a change of the series writes."""
        return {ch.file for c in self.commits for ch in c.changes}

    def base_of(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks `stack` is based on, transitively, in port.toml order."""
        names: set[str] = set()
        todo = list(stack.depends)
        while todo:
            name = todo.pop()
            if name not in names:
                names.add(name)
                todo.extend(self.stack(name).depends)
        return tuple(st for st in self.stacks if st.name in names)


def _load_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PortDescriptionError(f"{path} is missing", "every series folder needs a commit.toml") from None
    except tomllib.TOMLDecodeError as err:
        raise PortDescriptionError(f"{path}: invalid TOML: {err}", "fix the syntax") from None


def _change(raw: dict, folder: Path, root: Path, origin: str) -> Change:
    unknown = set(raw) - _CHANGE_KEYS
    if unknown:
        raise PortDescriptionError(f"{origin}: unknown key(s) {sorted(unknown)}",
                                   f"allowed keys: {sorted(_CHANGE_KEYS)}")
    for key in ("file", "placement", "template"):
        if key not in raw:
            raise PortDescriptionError(f"{origin}: missing `{key}`", "see templates/README.md")
    placement = raw["placement"]
    if placement not in PLACEMENTS:
        raise PortDescriptionError(f"{origin}: placement {placement!r} is not one of {PLACEMENTS}",
                                   "see templates/README.md")
    anchor = raw.get("anchor")
    if placement == "create" and anchor is not None:
        raise PortDescriptionError(f"{origin}: placement 'create' takes no anchor",
                                   "remove `anchor` or use after/before/replace")
    if placement != "create" and not anchor:
        raise PortDescriptionError(f"{origin}: placement {placement!r} needs a non-empty anchor",
                                   "add an `anchor` that matches exactly once in the file")
    if "within_end" in raw and "within" not in raw:
        raise PortDescriptionError(f"{origin}: `within_end` without `within`", "add `within` or drop `within_end`")
    template = folder / raw["template"]
    if not template.is_file():
        raise PortDescriptionError(f"{origin}: template {template} does not exist", "create it or fix `template`")
    file = raw["file"]
    if file.startswith("/") or ".." in Path(file).parts:
        raise PortDescriptionError(f"{origin}: file {file!r} must be a relative path inside the tree",
                                   "use a path like src/models/dflash.cpp")
    return Change(file=file, placement=placement, template=template.relative_to(root).as_posix(),
                  anchor=anchor, within=raw.get("within"), within_end=raw.get("within_end"),
                  regex=bool(raw.get("regex", False)), vars=dict(raw.get("vars", {})),
                  origin=origin, with_commit=raw.get("with_commit"), without_commit=raw.get("without_commit"))


def load_series(root: Path) -> Series:
    """The port description of the templates dir `root` (project.Places.templates_dir)."""
    port = _load_toml(root / "port.toml")
    meta = port.get("series", {})
    for key in ("author_name", "author_email", "date", "branch"):
        if key not in meta:
            raise PortDescriptionError(f"{root / 'port.toml'}: [series] has no `{key}`",
                                       "restore templates/port.toml from git")
    series_dir = root / "series"
    folders = sorted(p for p in series_dir.iterdir() if p.is_dir()) if series_dir.is_dir() else []
    commits = []
    for folder in folders:
        if not _FOLDER.match(folder.name):
            raise PortDescriptionError(f"{folder}: series folders are named NN-slug (two digits, lowercase slug)",
                                       "rename the folder, e.g. 25-model-my-change")
        data = _load_toml(folder / "commit.toml")
        unknown = set(data) - _COMMIT_KEYS
        if unknown:
            raise PortDescriptionError(f"{folder / 'commit.toml'}: unknown key(s) {sorted(unknown)}",
                                       f"allowed top-level keys: {sorted(_COMMIT_KEYS)}")
        raw_changes = data.get("change", [])
        if not raw_changes:
            raise PortDescriptionError(f"{folder / 'commit.toml'}: no [[change]] entries",
                                       "a commit must change something")
        message = folder / "message.txt.j2"
        if not message.is_file():
            raise PortDescriptionError(f"{message} is missing",
                                       "every commit needs a message draft: title, blank line, body")
        changes = tuple(_change(raw, folder, root, f"series/{folder.name}/commit.toml change #{i + 1}")
                        for i, raw in enumerate(raw_changes))
        commits.append(Commit(slug=folder.name, message_template=message.relative_to(root).as_posix(),
                              changes=changes, vars=dict(data.get("vars", {})),
                              stack=str(data.get("stack", ""))))
    if not commits:
        raise PortDescriptionError(f"{series_dir} holds no commit folders",
                                   "the series needs at least one templates/series/NN-slug/")
    for i, c in enumerate(commits):
        earlier = {e.slug for e in commits[:i]}
        for ch in c.changes:
            for key in ("with_commit", "without_commit"):
                slug = getattr(ch, key)
                if slug is not None and slug not in earlier:
                    raise PortDescriptionError(f"{ch.origin}: {key} = {slug!r} is not an earlier commit",
                                               "name the folder (templates/series/NN-slug) of a commit before this one")
    return Series(root=root, vars=dict(port.get("vars", {})), author_name=meta["author_name"],
                  author_email=meta["author_email"], date=meta["date"], branch=meta["branch"],
                  commits=tuple(commits), stacks=_stacks(root / "port.toml", port, commits))


def prose_file(name: str) -> str:
    """Where stack `name`'s prose lives, as the user names it."""
    return f"templates/{PROSE_DIR}/{name}.md"


def _prose(root: Path, names: list[str]) -> dict[str, tuple]:
    """Each stack's templates/stacks/<name>.md (none: no summary, facts or evidence) as
    (summary, issue facts, evidence); a file that names no stack is an error."""
    folder = root / PROSE_DIR
    files = {p.stem: p for p in folder.glob("*.md")} if folder.is_dir() else {}
    orphans = sorted(set(files) - set(names))
    if orphans:
        raise PortDescriptionError(f"{folder}: {', '.join(o + '.md' for o in orphans)} names no stack of port.toml",
                                   f"rename it to a stack's name ({', '.join(names)}) or delete it")
    return {name: _prose_file(path) for name, path in files.items()}


def _prose_file(path: Path) -> tuple[str, tuple[str, ...], tuple[Evidence, ...]]:
    """The summary (everything before the first `## `, a paragraph per line), then the _SECTIONS:
    `- fact` bullets, one a line; `- claim` bullets, each over one indented `` `command` `` line."""
    lines = path.read_text(encoding="utf-8").split("\n")
    start = next((i for i, ln in enumerate(lines) if ln.startswith("## ")), len(lines))
    paragraphs = re.split(r"\n\s*\n", "\n".join(lines[:start]))
    summary = "\n\n".join(" ".join(par.split()) for par in paragraphs if par.strip())

    def bad(line: int, what: str) -> PortDescriptionError:
        return PortDescriptionError(f"{path}:{line}: {what}", "after the summary, `## Issue facts`: a `- fact` "
                                    "line each; then `## Evidence`: a `- claim` line each, the next line "
                                    "indented, `` `command` `` (templates/README.md, PR stacks)")
    facts, evidence, section, claim = [], [], -1, None
    for i, ln in enumerate(lines[start:] + [""], start + 1):
        text = ln.strip()
        if claim is not None:        # the line under a claim: its command
            if not (ln[:1].isspace() and len(text) > 2 and text[0] == text[-1] == "`"):
                raise bad(i - 1, f"the claim {claim!r} has no `command` on the indented line under it")
            evidence.append(Evidence(claim, text[1:-1]))
            claim = None
        elif ln.startswith("#"):
            if text not in _SECTIONS or _SECTIONS.index(text) <= section:
                raise bad(i, f"the heading {text!r}: only {' then '.join(_SECTIONS)}, each at most once")
            section = _SECTIONS.index(text)
        elif ln.startswith("- ") or text == "-":
            if not text[1:].strip():
                raise bad(i, "an empty bullet")
            if section == 0:
                facts.append(text[1:].strip())
            else:
                claim = text[1:].strip()
        elif text:
            raise bad(i, f"{text!r} is not a `- ` bullet of {_SECTIONS[section]!r}")
    return summary, tuple(facts), tuple(evidence)


def _stacks(path: Path, port: dict, commits: list[Commit]) -> tuple[Stack, ...]:
    """port.toml [stacks.NAME], in file order; every commit names exactly one of them."""
    raw = port.get("stacks", {})
    if not isinstance(raw, dict) or not raw:
        raise PortDescriptionError(f"{path}: no [stacks.NAME] tables",
                                   "group the series into the pull requests upstream would get "
                                   "(see templates/README.md, PR stacks)")
    names = list(raw)
    for name, table in raw.items():
        if name in ("build", "evidence"):
            raise PortDescriptionError(f"{path}: [stacks.{name}]: the name is taken by "
                                       "`make pr`'s own folders (work/pr/build)", "rename the stack")
        if not _STACK.match(name) or not isinstance(table, dict):
            raise PortDescriptionError(f"{path}: [stacks.{name}] is not a table named with "
                                       "lowercase letters, digits and dashes", "e.g. [stacks.rpc]")
        moved = [k for k in ("summary", "issue_facts", "evidence") if k in table]
        if moved:
            raise PortDescriptionError(f"{path}: [stacks.{name}] {', '.join(moved)}: moved to {prose_file(name)}",
                                       "move the text there (summary paragraphs, figures as links to docs/bench.md, "
                                       "then `## Issue facts` and `## Evidence`: templates/README.md, PR stacks) "
                                       "and drop the key")
        unknown = set(table) - _STACK_KEYS
        if unknown or not table.get("title"):
            raise PortDescriptionError(f"{path}: [stacks.{name}] needs `title`"
                                       + (f"; unknown key(s) {sorted(unknown)}" if unknown else ""),
                                       f"allowed keys: {sorted(_STACK_KEYS)}")
    for c in commits:
        if not c.stack:
            raise PortDescriptionError(
                f"series/{c.slug} belongs to no PR stack",
                f"add `stack = \"NAME\"` to series/{c.slug}/commit.toml, NAME one of "
                f"{', '.join(names)} (or a new [stacks.NAME] in templates/port.toml)")
        if c.stack not in raw:
            raise PortDescriptionError(
                f"series/{c.slug}: stack {c.stack!r} is not defined in templates/port.toml",
                f"add a [stacks.{c.stack}] table with a `title`, or use one of {', '.join(names)}")
    prose = _prose(path.parent, names)
    out = []
    for name in names:
        members = tuple(c.slug for c in commits if c.stack == name)
        if not members:
            raise PortDescriptionError(f"{path}: [stacks.{name}] has no commits",
                                       f"set `stack = \"{name}\"` in a commit.toml, or drop the table")
        table = raw[name]
        depends = table.get("depends", [])
        earlier = names[:names.index(name)]
        if not isinstance(depends, list) or any(d not in earlier for d in depends):
            raise PortDescriptionError(f"{path}: [stacks.{name}] depends = {depends!r}: each entry must "
                                       "name a stack defined before it",
                                       f"stacks before {name}: {', '.join(earlier) or 'none'}")
        first = table.get("first_step")
        if first is not None and (not isinstance(first, dict) or set(first) != {"commit", "why"}
                                  or first["commit"] not in members or not str(first["why"]).strip()):
            raise PortDescriptionError(f"{path}: [stacks.{name}] first_step = {first!r}",
                                       'first_step = {commit = "NN-slug", why = "one line"}, the commit '
                                       f"one of the stack's: {', '.join(members)}")
        summary, facts, evidence = prose.get(name, ("", (), ()))
        out.append(Stack(name=name, title=table["title"], commits=members, depends=tuple(depends),
                         first_step=(first["commit"], first["why"].strip()) if first else None,
                         summary=summary, issue_facts=facts, evidence=evidence,
                         bench=_bench(path, name, table.get("bench")),
                         **_plan_keys(path, name, table, names.index(name) + 1)))
    return _check_plan(path, tuple(out), [n for n in names if "order" not in raw[n]])


def _bench(path: Path, name: str, table) -> Bench | None:
    """[stacks.NAME.bench], checked (None when the stack has none)."""
    if table is None:
        return None
    fix = ("keys " + ", ".join(f"{k} ({t.__name__})" for k, t in _BENCH_KEYS.items())
           + f"; `types` non-empty, of {', '.join(BENCH_TYPES)}; lists of strings; `shapes` non-empty; "
           "`kld_reference` only with `kld`")
    if (not isinstance(table, dict) or set(table) - set(_BENCH_KEYS)
            or any(not isinstance(v, _BENCH_KEYS[k]) for k, v in table.items())
            or not table.get("types") or set(table["types"]) - set(BENCH_TYPES)
            or any(not isinstance(x, str) for k in ("args", "ops", "shapes", "batched", "kld", "kld_reference")
                   for x in table.get(k, []))
            or ("shapes" in table and not table["shapes"]) or ("kld_reference" in table and not table.get("kld"))
            or any(k in table and (type(table[k]) is not int or table[k] < 1) for k in ("n_layer", "reps"))):
        raise PortDescriptionError(f"{path}: [stacks.{name}.bench] = {table!r}", fix)
    return Bench(types=tuple(table["types"]),
                 **{k: tuple(table[k]) for k in ("args", "ops", "shapes", "batched", "kld", "kld_reference")
                    if k in table},
                 **{k: table[k] for k in ("prompts", "params", "n_layer", "reps") if k in table})


def _plan_keys(path: Path, name: str, table: dict, position: int) -> dict:
    """[stacks.NAME]'s plan keys, checked: upstream, comment_on, order, issue_first, overlaps
    (without `order`, _check_plan places the stack after the ordered ones)."""
    def bad(key: str, fix: str) -> PortDescriptionError:
        return PortDescriptionError(f"{path}: [stacks.{name}] {key} = {table.get(key)!r}", fix)

    upstream = table.get("upstream", "pr")
    if upstream not in UPSTREAM_FORMS:
        raise bad("upstream", f"one of {', '.join(map(repr, UPSTREAM_FORMS))}: \"pr\" opens a pull "
                  "request, \"comment\" contributes to an open upstream PR named by `comment_on`, "
                  "\"kept\" stays in the series and is not sent (say `why`)")
    comment_on = table.get("comment_on")
    if upstream == "comment" and (type(comment_on) is not int or comment_on < 1):
        raise bad("comment_on", "a stack with upstream = \"comment\" names the upstream PR it "
                  "comments on: comment_on = 26724 (a PR number)")
    if upstream != "comment" and comment_on is not None:
        raise bad("comment_on", "only a stack with upstream = \"comment\" takes `comment_on`: "
                  "drop it, or set upstream = \"comment\"")
    why = table.get("why")
    if upstream == "kept" and (not isinstance(why, str) or not why.strip() or "\n" in why):
        raise bad("why", "a stack with upstream = \"kept\" says in one line why it stays in the "
                  "series and is not sent: why = \"...\"")
    if why is not None and (upstream == "pr" or not isinstance(why, str) or not why.strip() or "\n" in why):
        raise bad("why", "one non-empty line, only on a stack that is not a PR of ours (upstream = "
                  "\"comment\" or \"kept\"): drop it, or change `upstream`")
    order = table.get("order", position)
    if type(order) is not int or order < 1:
        raise bad("order", "a whole number from 1: the place in the sequence a new contributor opens the stacks in")
    issue_first = table.get("issue_first", False)
    if not isinstance(issue_first, bool):
        raise bad("issue_first", "true or false: true when upstream wants an issue before the PR")
    if issue_first and upstream != "pr":
        raise bad("issue_first", "a comment on an open PR, or a stack that is not sent, needs no "
                  "issue of its own: drop it")
    overlaps = table.get("overlaps", [])
    if not isinstance(overlaps, list) or any(
            not isinstance(o, dict) or set(o) != _OVERLAP_KEYS or not _REF.match(str(o["ref"]))
            or not str(o["relation"]).strip() or "\n" in str(o["relation"]) for o in overlaps):
        raise bad("overlaps", 'a list of {ref = "#27478", relation = "one line"}: ref an upstream '
                  "PR or issue number with its #, relation one non-empty line")
    return {"upstream": upstream, "comment_on": comment_on, "why": (why or "").strip(), "order": order,
            "issue_first": issue_first, "overlaps": tuple(Overlap(o["ref"], o["relation"].strip()) for o in overlaps)}


def _check_plan(path: Path, stacks: tuple[Stack, ...], unordered: list[str]) -> tuple[Stack, ...]:
    """Across the stacks: each its own `order`, after the stacks it is based on. A stack
    without `order` comes after every stack with one, in port.toml order."""
    last = max((st.order for st in stacks if st.name not in unordered), default=0)
    stacks = tuple(dataclasses.replace(st, order=last + 1 + unordered.index(st.name))
                   if st.name in unordered else st for st in stacks)
    seen: dict[int, str] = {}
    by_name = {st.name: st for st in stacks}
    for st in stacks:
        if st.order in seen:
            raise PortDescriptionError(f"{path}: [stacks.{st.name}] order = {st.order} is also "
                                       f"[stacks.{seen[st.order]}]'s", "give each stack its own order")
        seen[st.order] = st.name
        for dep in st.depends:
            if by_name[dep].order > st.order:
                raise PortDescriptionError(f"{path}: [stacks.{st.name}] order = {st.order} comes "
                                           f"before {dep} (order = {by_name[dep].order}), which it "
                                           "is based on", f"give {st.name} an order after {dep}'s")
    return stacks
