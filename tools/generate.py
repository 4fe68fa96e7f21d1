"""Refresh every generated, committed file, or check that none is stale.

    python -m tools.generate            # rewrite what is stale, in dependency order
    python -m tools.generate --check    # write nothing; list what is stale, exit 1 if any

Each generator below is the one its own command runs (named in the report); this module only
orders them and compares. A generator that reads generated files (the deploy/ copies read
alerts/rules/ and dashboards/) sees them as the earlier generators would leave them, so
`--check` lists exactly what a refresh would change. Golden expositions and the measured
series table of docs/capacity.md are not generated here: CONTRIBUTING.md says why.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from alerts import render as alerts
from dashboards import generator as dashboards
from llmmon import docsgen
from llmmon.commands import deploy
from llmmon.diagnose import schema

REPO = Path(__file__).resolve().parent.parent
COMMAND = "python -m tools.generate"

Files = Mapping[Path, str | None]  # repository-relative path -> text; None: must not exist


def _relative(files: Mapping[Path, str]) -> Files:
    return {path.relative_to(REPO): text for path, text in files.items()}


@dataclass(frozen=True)
class Generator:
    """One generator's own command (named in reports) and the files it makes from a tree."""

    command: str  # what refreshes its files alone
    files: Callable[[Path], Files]  # given the tree it reads (the checkout or a view of it)


# In dependency order: `llmmon deploy generate` copies what alerts.render and the dashboards
# generator write.
GENERATORS = (
    Generator("python -m llmmon.docsgen", lambda tree: docsgen.render(Path("docs"))),
    Generator("python -m llmmon.diagnose.schema > docs/diagnose.schema.json",
              lambda tree: {Path("docs/diagnose.schema.json"): schema.text()}),
    Generator("python -m alerts.render", lambda tree: _relative(
        alerts.render_files(alerts.render(alerts.load_thresholds())))),
    Generator("python -m dashboards.generator", lambda tree: _relative(dashboards.generate())),
    Generator("llmmon deploy generate",
              lambda tree: {Path(path): deploy.render(tree, path) for path in deploy.OUTPUTS}),
)


@dataclass(frozen=True)
class Output:
    """A generated file as it should be, and which generator makes it."""

    path: Path
    text: str | None
    generator: str

    def __str__(self) -> str:
        return f"{self.path} ({self.generator})"


def _current(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _view(root: Path, files: Files, into: Path) -> None:
    """Make `into` read as `root` with `files` in place: links to everything else, real folders
    on the way to each file, so that nothing written into the view reaches `root`."""
    folders = {parent for path in files for parent in path.parents}

    def mirror(folder: Path) -> None:
        (into / folder).mkdir(parents=True, exist_ok=True)
        for entry in (root / folder).iterdir() if (root / folder).is_dir() else ():
            if folder / entry.name in folders:
                mirror(folder / entry.name)
            elif folder / entry.name not in files:
                (into / folder / entry.name).symlink_to(entry)

    mirror(Path())
    for path, text in files.items():
        if text is not None:
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            (into / path).write_text(text, encoding="utf-8")


def expected(root: Path = REPO) -> list[Output]:
    """Every generated file as its generator makes it, each generator reading the tree as the
    ones before it would leave it."""
    outputs: list[Output] = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, generator in enumerate(GENERATORS):
            changed = {o.path: o.text for o in outputs if _current(root / o.path) != o.text}
            tree = Path(scratch, str(index)) if changed else root
            if changed:
                _view(root, changed, tree)
            outputs += [Output(path, text, generator.command)
                        for path, text in generator.files(tree).items()]
    return outputs


def stale(root: Path = REPO) -> list[Output]:
    """The generated files under `root` that differ from (or lack) what their generator makes."""
    return [o for o in expected(root) if _current(root / o.path) != o.text]


def refresh(root: Path = REPO) -> list[Output]:
    """Write (or remove) every stale generated file; returns them."""
    outdated = stale(root)
    for output in outdated:
        target = root / output.path
        if output.text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(output.text, encoding="utf-8")
    return outdated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; list the stale files and exit 1 if there are any")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        for output in outdated:
            print(f"stale: {output}")
        if outdated:
            print(f"run `{COMMAND}` and commit the result")
        return 1 if outdated else 0
    for output in refresh():
        print(f"{'removed' if output.text is None else 'wrote'}: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
