"""The flags of more than one verb, each declared once here: where llama.cpp comes from, the
places (project.Places), the proof's settings, and every other flag two verbs share.
One spelling has one meaning in every verb: `--target` is a GGUF file; a CMake target is
`--cmake-target`. A renamed flag keeps its old spelling, hidden from --help (`old` in SHARED);
where that spelling means something else in other verbs, `old_spelling` warns once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamacpp_mla_port.errors import PortError

if TYPE_CHECKING:
    from llamacpp_mla_port.project import Places
    from llamacpp_mla_port.series.pipeline import Options

# the engine is imported only by the verbs that use it: the device driver, which takes the place
# flags, runs where the engine's packages are not installed (tests/device/test_check.py)

#: canonical flag -> the older spellings still accepted (argparse aliases of the same dest).
#: `--work` was never the work dir: it is the old spelling of a run's --scratch-dir (smoke,
#: parity, device-check), so it stays that, and only that.
TREE_FLAGS = {"--work-dir": (), "--tree": (), "--build-dir": ("--build",)}
SCRATCH_FLAGS = {"--scratch-dir": ("--work",)}

#: Every other flag of two or more verbs: its settings (argparse's add_argument keywords; `flags`
#: its spellings when not only the key, `old` the renamed spellings still read, hidden from
#: --help). A verb may give its own help, default, required or metavar, never another meaning.
SHARED: dict[str, dict] = {
    "--target": dict(type=Path, metavar="TARGET.gguf", help="the target GGUF"),
    "--draft": dict(type=Path, metavar="DRAFT.gguf", help="the draft GGUF"),
    "--tokens": dict(metavar="IDS", help="comma-separated token ids"),
    "--out": dict(type=Path, metavar="DIR", help="output folder"),
    "--json": dict(action="store_true", help="print the result as JSON"),
    "--force": dict(action="store_true", help="do it although the verb would refuse (the refusal: its help)"),
    "--threads": dict(type=int, default=2, metavar="N", help="threads of every llama.cpp process (default: 2)"),
    "--jobs": dict(flags=("-j", "--jobs"), type=int, default=None, metavar="N",
                   help="parallel build jobs (default: all cores)"),
    "--repeats": dict(type=int, default=3, metavar="N", help="timed repeats of each measured pass (default: 3)"),
    "--rounds": dict(type=int, default=2, metavar="N", help="process rounds, interleaved A B ... B A (default: 2)"),
    "--stages": dict(default=None, metavar="A,B", help="a comma-separated subset of the stages"),
    "--stack": dict(dest="stacks", action="append", default=[], metavar="NAME",
                    help="only this PR stack (templates/port.toml [stacks]; repeatable)"),
    "--isa": dict(default=None, metavar="A,B", help="ggml-cpu builds, of native,avx2,scalar"),
    "--cmake-target": dict(dest="targets", action="append", default=None, metavar="TARGET", old=("--target",),
                           help="a CMake target to build (repeatable)"),
    "--cmake-arg": dict(dest="cmake_args", action="append", default=[], metavar="ARG",
                        help="extra CMake configure option, e.g. --cmake-arg=-DGGML_CUDA=ON "
                             "(with '=', the value starts with a dash; repeatable)"),
    "--git-url": dict(metavar="URL|PATH",
                      help="fetch from this URL or local llama.cpp clone instead of the pin's URL"),
    "--source": dict(default="auto",            # choices: source.obtain.SOURCES (shared() reads them)
                     help="git: fetch the pinned commit (or tag, checked by its tree); sdist: the PyPI "
                          "sdist that vendors it; auto (default): git, then the sdist on a network failure"),
    "--commit": dict(metavar="SHA", help="use another upstream commit than the pin (experiments; the sdist "
                                         "does not apply then)"),
    "--sdist-file": dict(type=Path, metavar="PATH", help="use this already-downloaded sdist (sha256 still checked)"),
    "--patches-dir": dict(type=Path, default=None, metavar="DIR",
                          help="where the exported series lives (default: ./patches)"),
    "--templates-dir": dict(type=Path, default=None, metavar="DIR",
                            help="the port description (default: ./templates)"),
    # the proof's settings (add_proof_args): smoke, rebase --prove, pr --smoke-arg
    "--quick": dict(action="store_true", help="lossless: each draft length and flash attention / p_min "
                                              "pair once, 5 runs not 14 (a quicker, weaker run)"),
    "--no-server": dict(action="store_true", help="skip the llama-server runs"),
}
#: what a verb may set of a shared flag besides its meaning
_OWN = {"help", "default", "required", "metavar", "dest", "action"}
#: the proof's settings, as smoke spells them; proof_settings() reads them
PROOF_FLAGS = ("--quick", "--no-server", "--threads")


def _tag(action: argparse.Action, name: str) -> argparse.Action:
    action.shared_flag = name           # tests/test_readme.py: a flag of two verbs comes from here
    return action


def shared(parser, name: str, **own) -> argparse.Action:
    """Add the shared flag `name` (SHARED) to `parser` (or a group); `own`: this verb's help,
    default, required or metavar (`dest`/`action`: a verb that takes one value, not several)."""
    if set(own) - _OWN:
        raise TypeError(f"{name}: a verb sets only {sorted(_OWN)} of a shared flag, not {sorted(set(own) - _OWN)}")
    spec = {k: v for k, v in SHARED[name].items() if k not in ("flags", "old")}
    if own.get("action") == "store":
        spec.pop("default", None)
    spec.update(own)
    if name == "--source":
        from llamacpp_mla_port.source.obtain import SOURCES
        spec["choices"] = SOURCES
    action = _tag(parser.add_argument(*SHARED[name].get("flags", (name,)), **spec), name)
    for old in SHARED[name].get("old", ()):
        hidden = {k: v for k, v in spec.items() if k not in ("help", "default", "required", "metavar")}
        _tag(old_spelling(parser, old, SHARED[name].get("flags", (name,))[-1], **hidden), name)
    return action


def log(msg: str) -> None:
    """A progress line on stderr (stdout is the verb's result)."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def old_spelling(parser, old: str, new: str, **spec) -> argparse.Action:
    """`old`, hidden from --help, read as `new` (`spec`: its dest, type, action), with a warning
    naming `new` the first time a parse meets it: in other verbs `old` means something else."""
    base = parser._registry_get("action", spec.pop("action", None), None)

    class Old(base):
        def __call__(self, parser, namespace, values, option_string=None):
            if not getattr(self, "warned", False):
                self.warned = True
                sys.stderr.write(f"warning: {parser.prog}: {old} is an old spelling here, with another "
                                 f"meaning in other verbs: use {new}\n")
            super().__call__(parser, namespace, values, option_string)

    return parser.add_argument(old, action=Old, **spec, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_tree_args(parser: argparse.ArgumentParser, *, work: bool = True, tree: bool = True,
                  build: bool = True, tree_help: str | None = None, build_help: str | None = None) -> None:
    """--work-dir, --tree, --build-dir (the old spelling --build kept): one spelling and one
    meaning in every verb; project.Places resolves them (flag > env > the checkout)."""
    g = parser.add_argument_group("places (flag, else $MLA_PORT_WORK_DIR / $MLA_PORT_TREE / "
                                  "$MLA_PORT_BUILD, else the checkout's work/)")
    if work:
        _tag(g.add_argument("--work-dir", *TREE_FLAGS["--work-dir"], dest="work_dir", type=Path, default=None,
                            metavar="DIR", help="tool-owned work dir holding llama.cpp/ and build/ "
                                                "(default: ./work, or $MLA_PORT_WORK_DIR)"), "--work-dir")
    if tree:
        _tag(g.add_argument("--tree", dest="tree", type=Path, default=None, metavar="DIR",
                            help=tree_help or "patched llama.cpp tree (default: the work tree, or $MLA_PORT_TREE)"),
             "--tree")
    if build:
        _tag(g.add_argument("--build-dir", *TREE_FLAGS["--build-dir"], dest="build_dir", type=Path, default=None,
                            metavar="DIR",
                            help=build_help or "its CMake build dir (default: the work build, or $MLA_PORT_BUILD)"),
             "--build-dir")


def add_scratch_arg(parser, help: str) -> None:
    """--scratch-dir (old spelling --work): a run's own scratch folder, not the work dir."""
    _tag(parser.add_argument("--scratch-dir", *SCRATCH_FLAGS["--scratch-dir"], dest="scratch_dir", type=Path,
                             default=None, metavar="DIR", help=help), "--scratch-dir")


def add_source_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("where the llama.cpp base comes from")
    shared(g, "--source")
    shared(g, "--git-url")
    shared(g, "--sdist-file")
    shared(g, "--commit")
    add_tree_args(parser, tree=False, build=False)
    shared(parser, "--patches-dir")


def options(args: argparse.Namespace, places: Places) -> Options:
    from llamacpp_mla_port.series.pipeline import Options
    return Options(places, source=args.source, git_url=args.git_url, sdist_file=args.sdist_file, commit=args.commit)


# ------------------------------------------------------------------------ the proof's settings
def add_proof_args(parser) -> None:
    """The proof's settings (proof.smoke.run_smoke / prove_into: quick, server, threads)."""
    shared(parser, "--quick")
    shared(parser, "--no-server")
    shared(parser, "--threads", help="threads of every llama.cpp process of the proof (default: 2)")


def proof_settings(args: argparse.Namespace) -> dict:
    """The proof's keyword arguments from a verb's parsed add_proof_args flags."""
    return {"quick": args.quick, "server": not args.no_server, "threads": args.threads}


def parse_proof_args(values: list[str], verb: str = "pr --smoke-arg") -> dict:
    """proof_settings() of flags given as strings (`pr --smoke-arg=--quick`); any other flag is
    refused naming the ones the proof takes."""
    parser = argparse.ArgumentParser(prog=verb, add_help=False, exit_on_error=False)
    add_proof_args(parser)
    allowed = ", ".join(PROOF_FLAGS[:-1]) + f" or {PROOF_FLAGS[-1]}=N"
    try:
        given, rest = parser.parse_known_args(values)
    except argparse.ArgumentError as err:
        raise PortError(f"{verb} {' '.join(values)}: {err}", f"pass only {allowed}") from None
    if rest:
        raise PortError(f"{verb} {' '.join(rest)}: make pr runs the proof on the work tree, in "
                        "<work-dir>/pr/proof", f"pass only {allowed}")
    return proof_settings(given)
