"""The lint half of `pr`: the tree's own .editorconfig / .ecrc whitespace rules and its
.flake8 (with the flake8-no-print plugin upstream CI uses) on the files a commit touches."""

from __future__ import annotations

import configparser
import fnmatch
import importlib.util
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from llamacpp_mla_port.process import run


# ------------------------------------------------------------------------- editorconfig
def _glob_regex(glob: str) -> str:
    """EditorConfig glob -> regex over a /-separated path relative to the config's dir."""
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "{":
            j = glob.find("}", i)
            if j == -1:
                out.append(re.escape(c))
            else:
                out.append("(?:" + "|".join(_glob_regex(p) for p in glob[i + 1:j].split(",")) + ")")
                i = j
        elif c == "[":
            j = glob.find("]", i)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = glob[i + 1:j]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass
class EditorConfig:
    sections: list[tuple[re.Pattern, dict[str, str]]]
    excludes: list[re.Pattern] = field(default_factory=list)   # .ecrc "Exclude"
    disabled: set[str] = field(default_factory=set)            # .ecrc "Disable"

    @classmethod
    def load(cls, tree: Path) -> "EditorConfig":
        sections: list[tuple[re.Pattern, dict[str, str]]] = []
        path = tree / ".editorconfig"
        if path.is_file():
            current = None
            for raw in path.read_text(encoding="utf-8").splitlines():
                line = raw.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    glob = line[1:-1]
                    glob = glob[1:] if glob.startswith("/") else (glob if "/" in glob else "**/" + glob)
                    rx = _glob_regex(glob)
                    if rx.startswith(".*/"):                  # `**/x` also matches top-level x
                        rx = "(?:.*/)?" + rx[3:]
                    current = {}
                    sections.append((re.compile(rf"^{rx}$"), current))
                elif "=" in line and current is not None:
                    k, v = line.split("=", 1)
                    current[k.strip().lower()] = v.strip().lower()
        excludes, disabled = [], set()
        ecrc = tree / ".ecrc"
        if ecrc.is_file():
            data = json.loads(ecrc.read_text(encoding="utf-8"))
            excludes = [re.compile(p) for p in data.get("Exclude", [])]
            disabled = {k for k, v in data.get("Disable", {}).items() if v}
        return cls(sections, excludes, disabled)

    def properties(self, rel: str) -> dict[str, str]:
        props: dict[str, str] = {}
        for rx, values in self.sections:
            if rx.match(rel):
                props.update(values)
        return {k: v for k, v in props.items() if v != "unset"}

    def excluded(self, rel: str) -> bool:
        return any(rx.search(rel) for rx in self.excludes)


@dataclass
class Finding:
    check: str      # "flake8" | "editorconfig" | "build"
    file: str
    line: int | None
    code: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.code} {self.message}"


def whitespace_findings(tree: Path, files: Iterable[str],
                        config: EditorConfig | None = None) -> list[Finding]:
    """The tree's .editorconfig rules (as editorconfig-checker applies them with the tree's
    .ecrc) on `files`: final newline, trailing whitespace, line endings, tab indentation
    where spaces are required, UTF-8. Indent sizes are not checked (llama.cpp's .ecrc
    disables that); tab-style sections are not checked for stray spaces."""
    config = config or EditorConfig.load(tree)
    out: list[Finding] = []
    for rel in sorted(set(files)):
        path = tree / rel
        if not path.is_file() or config.excluded(rel):
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue                                   # binary: the checker skips it too
        props = config.properties(rel)

        def add(code: str, line: int | None, msg: str) -> None:
            out.append(Finding("editorconfig", rel, line, code, msg))

        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            if props.get("charset") == "utf-8":
                add("Charset", None, f"not UTF-8 ({err.reason} at byte {err.start})")
            continue
        lines = text.split("\n")
        if props.get("insert_final_newline") == "true" and "InsertFinalNewline" not in \
                config.disabled and text and not text.endswith("\n"):
            add("InsertFinalNewline", len(lines), "no newline at the end of the file")
        if props.get("insert_final_newline") == "false" and text.endswith("\n") and \
                "InsertFinalNewline" not in config.disabled:
            add("InsertFinalNewline", len(lines) - 1, "newline at the end of the file")
        for no, line in enumerate(lines, 1):
            if props.get("end_of_line") == "lf" and line.endswith("\r") and \
                    "EndOfLine" not in config.disabled:
                add("EndOfLine", no, "CRLF line ending (lf required)")
            body = line.rstrip("\r")
            if props.get("trim_trailing_whitespace") == "true" and body != body.rstrip(" \t") \
                    and "TrimTrailingWhitespace" not in config.disabled:
                add("TrimTrailingWhitespace", no, "trailing whitespace")
            if props.get("indent_style") == "space" and "Indentation" not in config.disabled:
                indent = body[:len(body) - len(body.lstrip(" \t"))]
                if "\t" in indent:
                    add("Indentation", no, "tab in indentation (indent_style = space)")
    return out


# ------------------------------------------------------------------------------- flake8
_FLAKE8_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<code>\S+) (?P<msg>.*)$")


def flake8_excludes(config: Path) -> list[str]:
    """The `exclude` patterns of a .flake8 (comments and blank entries dropped)."""
    parser = configparser.ConfigParser()
    parser.read_string(config.read_text(encoding="utf-8"))
    raw = parser.get("flake8", "exclude", fallback="")
    return [part.strip() for line in raw.splitlines() for part in line.split("#", 1)[0].split(",") if part.strip()]


def flake8_findings(tree: Path, files: Iterable[str]) -> list[Finding]:
    """flake8 with the tree's own .flake8 on the touched Python `files`, as upstream CI runs
    it (`flake8` over the tree, with the flake8-no-print plugin): the config's `exclude`
    patterns are matched against every path component, as flake8 does while walking."""
    py = sorted({f for f in files if f.endswith(".py") and (tree / f).is_file()})
    config = tree / ".flake8"
    if not py:
        return []
    if not config.is_file():
        return [Finding("flake8", ".flake8", None, "config", "the tree has no .flake8: not checked")]
    excludes = flake8_excludes(config)
    py = [f for f in py if not any(fnmatch.fnmatch(part, pat) or fnmatch.fnmatch(f, pat)
                                   for part in Path(f).parts for pat in excludes)]
    if not py:
        return []
    out = []
    if importlib.util.find_spec("flake8_no_print") is None:
        out.append(Finding("flake8", "", None, "plugin",
                           "flake8-no-print (used by upstream CI) is not installed: NP100 "
                           "print() findings were not checked"))
    proc = run([sys.executable, "-m", "flake8", "--config", config, *py], cwd=tree, timeout=600)
    for line in proc.stdout.splitlines():
        m = _FLAKE8_LINE.match(line.strip())
        if m:
            out.append(Finding("flake8", m["file"].removeprefix("./"), int(m["line"]), m["code"], m["msg"]))
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not out):
        out.append(Finding("flake8", "", None, "error", (proc.stderr or proc.stdout).strip()[-500:]))
    return out


# ------------------------------------------------------------- upstream's PR checks
#: the ty version upstream's python-type-check.yml pins
TY_VERSION = "0.0.84"
_POSITION = re.compile(r":\d+(?::\d+)?(?=:)")


def _unplaced(line: str) -> str:
    """A finding without its line/column, so base and patched findings compare."""
    return _POSITION.sub("", line, count=1).strip()


def model_naming_errors(tree: Path) -> list[str]:
    """code-style.yml's model-naming rule: every `case LLM_ARCH_X: return new llama_model_x(`
    in src/llama-model.cpp has matching names and a src/models/x.cpp."""
    path = tree / "src" / "llama-model.cpp"
    if not path.is_file():
        return []
    pairs = re.findall(r"case\s+(LLM_ARCH_\w+)\s*:\s*\n\s+return new (llama_model_\w+)\s*\(",
                       path.read_text(errors="replace"))
    errors = []
    for arch, cls in pairs:
        suffix, csuffix = arch[len("LLM_ARCH_"):], cls[len("llama_model_"):]
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", suffix):
            errors.append(f"{arch}: suffix not upper snake case")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", csuffix):
            errors.append(f"{arch}: class suffix not lower snake case")
        elif suffix.lower() != csuffix:
            errors.append(f"{arch}: arch/class name mismatch ({cls})")
        elif not (tree / "src" / "models" / (csuffix.replace("_", "-") + ".cpp")).is_file():
            errors.append(f"{arch}: no src/models/{csuffix.replace('_', '-')}.cpp")
    return errors


def ty_findings(tree: Path) -> list[str] | str:
    """`ty check` with the tree's ty.toml, as python-type-check.yml runs it; a string says
    why it did not run."""
    exe = shutil.which("ty", path=str(Path(sys.executable).parent)) or shutil.which("ty")
    if exe is None:
        return f"ty is not installed (pip install ty=={TY_VERSION})"
    version = run([exe, "--version"], timeout=60).stdout.split()
    if version[-1:] != [TY_VERSION]:
        return f"ty {' '.join(version[1:])} is not the pinned {TY_VERSION}"
    proc = run([exe, "check", "--exit-zero-on-warning", "--output-format=concise", "--python", sys.prefix],
               cwd=tree, timeout=600)
    return [ln for ln in proc.stdout.splitlines() if re.match(r"^\S+:\d+:\d+: ", ln)]


def pretokenizer_findings(tree: Path) -> list[str] | str:
    """pre-tokenizer-hashes.yml: convert_hf_to_gguf_update.py --check-missing must leave
    conversion/base.py as it is (the file is restored either way)."""
    script, base_py = tree / "convert_hf_to_gguf_update.py", tree / "conversion" / "base.py"
    if not script.is_file() or not base_py.is_file():
        return "the tree has no convert_hf_to_gguf_update.py / conversion/base.py"
    before = base_py.read_bytes()
    try:
        proc = run([sys.executable, script.name, "--check-missing"], cwd=tree, timeout=600)
        after = base_py.read_bytes()
    finally:
        base_py.write_bytes(before)
    if proc.returncode != 0:
        return f"convert_hf_to_gguf_update.py failed (exit {proc.returncode}): {proc.stderr[-300:]}"
    return [] if after == before else ["conversion/base.py: pre-tokenizer hashes are not up to date"]


def tree_checks(tree: Path, files: list[str], whole: dict | None = None) -> dict[str, list[str] | str]:
    """Upstream's no-compile PR checks on one checked-out tree: flake8 (+ flake8-no-print)
    and the editorconfig rules on `files`; ty, model naming and pre-tokenizer hashes on the
    whole tree (taken from `whole` when given: the same tree checked before)."""
    if whole is None:
        ty = ty_findings(tree)
        whole = {"ty": [_unplaced(x) for x in ty] if isinstance(ty, list) else ty,
                 "model-naming": model_naming_errors(tree), "pre-tokenizer": pretokenizer_findings(tree)}
    return {"flake8": [_unplaced(str(f)) for f in flake8_findings(tree, files)],
            "editorconfig": [_unplaced(str(f)) for f in whitespace_findings(tree, files)],
            **{k: whole[k] for k in ("ty", "model-naming", "pre-tokenizer")}}


def introduced(base: dict, patched: dict) -> dict:
    """Per check: findings on the base, on the patched tree, and those the patch adds
    (compared without line numbers, as multisets)."""
    from collections import Counter
    out = {}
    for name in patched:
        b, p = base.get(name), patched[name]
        if isinstance(b, str) or isinstance(p, str):
            out[name] = {"ran": False, "note": p if isinstance(p, str) else b}
            continue
        added = list((Counter(p) - Counter(b or [])).elements())
        out[name] = {"ran": True, "base": len(b or []), "patched": len(p), "introduced": added}
    return out
