"""`python -m dashboards.generator [--check]`: write the dashboards, or check them for drift."""

from __future__ import annotations

import argparse
import sys

from dashboards.generator import generate


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generator",
                                     description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed dashboard differs")
    args = parser.parse_args()
    stale = []
    for path, text in generate().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'differs' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
