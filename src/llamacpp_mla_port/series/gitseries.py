"""Turn rendered commits into git commits, a format-patch series, and an applied branch.

- `commit_rendered`: one commit per rendered commit, built with a private index on top of
  the base (the work tree is not touched), fixed author/committer/date.
- `export`: `git format-patch --zero-commit --no-signature --full-index`, plus `series`,
  `manifest.json` (base commit, sha256 of every patch) and `README.md` (which template folder
  each patch comes from, and its PR stack). Byte-reproducible.
- `drift`: what differs between a fresh export and the checked-in patches/.
- `apply`: `git am -3` of patches/ onto the base on the tool's branch; never fuzz.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import unidiff

from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import PatchApplyError, ProcessError, SeriesError
from llamacpp_mla_port.series.render import RenderedCommit
from llamacpp_mla_port.series.spec import Series
from llamacpp_mla_port.source.pin import Pin
from llamacpp_mla_port.jsonfile import write_json

MANIFEST = "manifest.json"
SERIES = "series"
#: patches/README.md: the table of patch -> template folder -> stack (`index_text`)
INDEX = "README.md"


def series_env(series: Series) -> dict[str, str]:
    return git.identity_env(series.author_name, series.author_email, series.date)


def commit_rendered(repo: git.Repo, base_sha: str, rendered: list[RenderedCommit],
                    series: Series) -> list[str]:
    """Create the series' commits on top of `base_sha`; return their ids in order."""
    env = series_env(series)
    shas = []
    with tempfile.TemporaryDirectory(prefix="mla-port-index-") as tmp:
        index_env = {**env, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(repo, "read-tree", base_sha, env=index_env)
        parent = base_sha
        for commit in rendered:
            files = sorted(commit.files.items())
            modes = git.file_modes(repo, parent, [path for path, _ in files])
            blobs = git.store_blobs(repo, [data for _, data in files])
            entries = [f"{modes.get(path, '100644')} {blob}\t{path}" for (path, _), blob in zip(files, blobs)]
            git.run(repo, "update-index", "--index-info", env=index_env, input="\n".join(entries) + "\n")
            tree = git.run(repo, "write-tree", env=index_env)
            parent = git.run(repo, "commit-tree", tree, "-p", parent, "-F", "-", input=commit.message, env=env)
            shas.append(parent)
    return shas


def export(repo: git.Repo, base_sha: str, head_sha: str, out_dir: Path, pin: Pin,
           series: Series, slugs: list[str] | None = None) -> list[str]:
    """Write the series as patches into `out_dir` (created empty); return patch names. `slugs`:
    the template folder of each commit of base..head, in order, for the index (INDEX)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    git.run(repo, "format-patch", "--zero-commit", "--no-signature", "--full-index", "--numbered",
            "--subject-prefix=PATCH", "--stat=80", "--no-color", "--no-binary", "-o", str(out_dir),
            f"{base_sha}..{head_sha}", env=series_env(series))
    names = sorted(p.name for p in out_dir.glob("*.patch"))
    (out_dir / SERIES).write_text("".join(f"{n}\n" for n in names))
    manifest = {
        "base": {"url": pin.url, "commit": pin.commit, "tag": pin.tag,
                 **({} if pin.commit else {"tree": pin.tree})},
        "generator": "llamacpp-mla-port",
        "apply": "git am -3 $(sed 's|^|patches/|' patches/series)",
        "patches": [patch_entry(out_dir / n) for n in names],
    }
    write_json(out_dir / MANIFEST, manifest, indent=2)
    if slugs is not None:
        (out_dir / INDEX).write_text(index_text(series, names, slugs))
    return names


def index_text(series: Series, names: list[str], slugs: list[str]) -> str:
    """patches/README.md: each patch, the template folder it is rendered from, its PR stack."""
    if len(names) != len(slugs):
        raise SeriesError(f"format-patch wrote {len(names)} patches for {len(slugs)} commits",
                          "a commit that changes nothing gives no patch: give it a change or drop it")
    stack_of = {c.slug: c.stack for c in series.commits}
    rows = [f"| {name} | {slug} | {stack_of.get(slug, '')} |" for name, slug in zip(names, slugs)]
    return ("# The exported series (written by `make patch`: do not edit)\n\n"
            "Each patch, the template folder it is rendered from (`templates/series/`), and the PR stack\n"
            "it belongs to (`templates/port.toml`). Apply: `git am -3 $(sed 's|^|patches/|' patches/series)`.\n\n"
            "| patch | template folder | stack |\n|---|---|---|\n" + "\n".join(rows) + "\n")


def patch_entry(path: Path) -> dict:
    """Manifest entry of one patch: its sha256 and, parsed with unidiff, what it touches."""
    data = path.read_bytes()
    parsed = unidiff.PatchSet(data.decode("utf-8"))
    return {
        "name": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "files": [{"path": f.path, "added": f.added, "removed": f.removed,
                   "new": f.is_added_file} for f in parsed],
    }


def managed_files(patches_dir: Path) -> list[str]:
    """The files of patches/ the tool owns (everything else there is left alone)."""
    if not patches_dir.is_dir():
        return []
    return sorted(p.name for p in patches_dir.iterdir()
                  if p.is_file() and (p.suffix == ".patch" or p.name in (SERIES, MANIFEST, INDEX)))


def drift(fresh_dir: Path, patches_dir: Path) -> str:
    """A unified diff of checked-in patches/ against a fresh export ('' when identical)."""
    out = []
    for name in sorted(set(managed_files(fresh_dir)) | set(managed_files(patches_dir))):
        a, b = (p.read_text(errors="replace").splitlines(keepends=True) if p.exists() else []
                for p in (patches_dir / name, fresh_dir / name))
        if a != b:
            out.extend(difflib.unified_diff(a, b, f"patches/{name} (checked in)", f"patches/{name} (fresh render)"))
    return "".join(out)


def install(fresh_dir: Path, patches_dir: Path) -> bool:
    """Make patches/ equal to `fresh_dir`; return whether anything changed."""
    if not drift(fresh_dir, patches_dir):
        return False
    patches_dir.mkdir(parents=True, exist_ok=True)
    staging = patches_dir.parent / f".{patches_dir.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(fresh_dir, staging)
    for name in managed_files(patches_dir):
        if not (staging / name).exists():
            (patches_dir / name).unlink()
    for name in managed_files(staging):
        os.replace(staging / name, patches_dir / name)
    shutil.rmtree(staging, ignore_errors=True)
    return True


def read_series(patches_dir: Path) -> list[Path]:
    listing = patches_dir / SERIES
    if not listing.is_file():
        raise SeriesError(f"{listing} is missing", "run `make patch` to export the series")
    paths = [patches_dir / n.strip() for n in listing.read_text().splitlines() if n.strip()]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise SeriesError(f"patches/series names missing files: {', '.join(missing)}",
                          "run `make patch` to export the series again")
    return paths


def verify_manifest(patches_dir: Path) -> None:
    try:
        manifest = json.loads((patches_dir / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError) as err:
        raise SeriesError(f"{patches_dir / MANIFEST} is missing or corrupt ({err})",
                          "run `make patch` to export the series again") from None
    for entry in manifest.get("patches", []):
        data = (patches_dir / entry["name"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise SeriesError(f"patches/{entry['name']} does not match its sha256 in the manifest",
                              "it was edited by hand: edit the templates instead and rerun `make patch`")


def apply(repo: git.Repo, base_sha: str, branch: str, patches: list[Path],
          series: Series) -> str:
    """`git am -3` the patches onto `base_sha` on `branch`; return the new HEAD.

    `git am` applies exactly or falls back to a 3-way merge by blob id; it never applies
    with fuzz. On failure the am is aborted and the branch is reset to the base.
    """
    git.run(repo, "checkout", "-q", "-B", branch, base_sha)
    env = series_env(series)
    try:
        git.run(repo, "am", "-3", "--quiet", "--committer-date-is-author-date", *[str(p) for p in patches], env=env)
    except ProcessError as err:
        text = git.error_text(err)
        details = _am_failure(repo, f"{err.stderr_tail}\n{err.stdout_tail}", patches)
        failing = details.get("subject", "")
        with contextlib.suppress(ProcessError):
            git.run(repo, "am", "--abort")
        git.run(repo, "checkout", "-q", "-f", "-B", branch, base_sha)
        raise PatchApplyError(f"`git am -3` failed{' at ' + failing if failing else ''}: {text}",
                              "the patches do not apply to this base: run `make patch` to "
                              "re-render them; the work tree was reset to the base",
                              details) from None
    return git.run(repo, "rev-parse", "HEAD")


_PATCH_FAILED = re.compile(r"error: patch failed: (?P<file>[^\s:]+):(?P<line>\d+)")
_CONFLICT = re.compile(r"CONFLICT \([^)]*\): Merge conflict in (?P<file>[^\s']+)")


def _am_failure(repo: git.Repo, text: str, patches: list[Path]) -> dict:
    """What `git am` stopped on, read before the am is aborted: the patch, its subject, and
    the rejected hunk (the hunk of the patch as am read it, which starts at the line git
    names) or the conflict a 3-way merge left in the file."""
    d = Path(repo.git_dir) / "rebase-apply"
    out: dict = {"output": "\n".join(ln.strip() for ln in text.splitlines() if ln.strip())}
    with contextlib.suppress(OSError, IndexError, ValueError):
        nxt = int((d / "next").read_text().strip())
        out["patch"] = patches[nxt - 1].name if 0 < nxt <= len(patches) else f"#{nxt}"
        out["subject"] = (d / f"{nxt:04d}").read_text(errors="replace").split("Subject: ", 1)[1].splitlines()[0]
    m = _PATCH_FAILED.search(text)
    if m:
        out["file"], out["line"] = m["file"], int(m["line"])
        with contextlib.suppress(OSError, unidiff.UnidiffParseError):
            # am's own copy of the diff: what it tried to apply (CRs already stripped)
            for f in unidiff.PatchSet((d / "patch").read_text(errors="replace")):
                if f.path == m["file"]:
                    hunk = next((h for h in f if h.source_start == int(m["line"])), None)
                    if hunk is not None:
                        out["hunk"] = str(hunk)
        return out
    m = _CONFLICT.search(text)
    if m:
        out["file"] = m["file"].strip()
        with contextlib.suppress(OSError, StopIteration):
            lines = (Path(repo.working_tree_dir) / out["file"]).read_text(errors="replace").splitlines()
            start = next(i for i, ln in enumerate(lines) if ln.startswith("<<<<<<<"))
            end = next(i for i in range(start, len(lines)) if lines[i].startswith(">>>>>>>"))
            out["line"] = start + 1
            out["hunk"] = "\n".join(lines[start:end + 1]) + "\n"
    return out
