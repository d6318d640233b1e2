"""The one JSON writer: every report, manifest, state file and config this package writes.

    write_json(path, data, indent=2, *, default=None, sort_keys=False) -> path

Indented JSON plus a newline, written atomically (a temp file beside it, renamed into place),
the parent folders made; `default` and `sort_keys` as json.dumps takes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, data, indent: int = 2, *, default=None, sort_keys: bool = False) -> Path:
    """Write `data` as indented JSON plus a newline, atomically (a temp file renamed into place);
    `default` and `sort_keys` as json.dumps takes them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=indent, default=default, sort_keys=sort_keys) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
