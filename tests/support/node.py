"""The Node.js the Makefile installs from npm (`make node`: `.node/`, pinned there) with the offline ASL validator.

The CDK library's jsii runtime runs on it: the library supports Node 22 and 24 and prints an end-of-life warning on
an older one, which a machine's own `node` may be. Without `make node` the machine's `node` runs jsii (and the
warning shows: nothing hides it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / ".node"
BIN = NODE_DIR / "node_modules" / ".bin"
NODE = BIN / "node"


def pinned_version() -> str:
    """NODE_VERSION in the Makefile: the one Node this project installs and documents."""
    match = re.search(r"^NODE_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile pins no NODE_VERSION"
    return match[1]


def use_project_node() -> None:
    """jsii starts node at the first `import aws_cdk`: call this before any test module imports it."""
    if NODE.is_file():
        os.environ.setdefault("JSII_NODE", str(NODE))
