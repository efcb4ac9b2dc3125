"""What goes into the Lambda asset besides the pip-installed dependencies, and its byte-code. Standard library only:
it also runs inside the Lambda build image (Docker bundling), where neither the CDK nor the project is installed.

    python infra/asset_files.py SOURCE_ROOT OUTPUT_DIR [--compile]

The byte-code is compiled by the interpreter that runs this (in the build image: the Lambda runtime's own
Python; a .pyc of another version is ignored by the runtime) with hash-based, unchecked invalidation: the CDK
zips every file with the same 1980 timestamp, so timestamp-checked .pyc files would never match their source,
and /var/task is read-only, so Lambda would recompile every module on every cold start (issue #17).
"""

from __future__ import annotations

import argparse
import compileall
import py_compile
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

# The packages Lambda runs; gpu_worker, infra and tests never ship in the Lambda bundle.
LAMBDA_PACKAGES = ("nightbatch", "functions")
_SKIP_PARTS = frozenset({"__pycache__", "tests"})
# The local stack (moto server, CPU engines) never runs in Lambda.
_SKIP_DIRS = ("nightbatch/local/",)
# ... except the chat templates the settings resolve (nightbatch.settings imports nightbatch.models.templates).
_KEEP = ("nightbatch/local/__init__.py", "nightbatch/models/templates/")
# Where Lambda unpacks the asset: tracebacks name /var/task/… files, as they would without the .pyc files.
LAMBDA_TASK_ROOT = "/var/task"


def code_files(root: Path) -> Iterable[Path]:
    for package in LAMBDA_PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(root)
            if (path.is_file() and not _SKIP_PARTS.intersection(relative.parts)
                    and (not relative.as_posix().startswith(_SKIP_DIRS) or relative.as_posix().startswith(_KEEP))
                    and path.suffix not in (".pyc", ".pyo")):
                yield path


def copy_code(root: Path, output_dir: Path) -> None:
    for path in code_files(root):
        target = output_dir / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def compile_asset(output_dir: Path) -> None:
    """Every .py in the asset (dependencies and code) to __pycache__/*.cpython-XY.pyc for this interpreter."""
    ok = compileall.compile_dir(
        str(output_dir), quiet=1, workers=0, stripdir=str(output_dir), prependdir=LAMBDA_TASK_ROOT,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:  # a file that does not compile is compiled (or fails) at import, as without the .pyc files
        print(f"compileall: some files in {output_dir} did not compile", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source_root", type=Path)
    p.add_argument("output_dir", type=Path)
    p.add_argument("--compile", action="store_true", help="also write .pyc files for this interpreter")
    args = p.parse_args(argv)
    copy_code(args.source_root, args.output_dir)
    if args.compile:
        compile_asset(args.output_dir)
        print(f"compiled the asset for Python {sys.version_info.major}.{sys.version_info.minor}", file=sys.stderr)


if __name__ == "__main__":
    main()
