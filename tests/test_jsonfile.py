"""The one JSON writer (jsonfile.write_json): indented, a newline at the end, atomic."""

from __future__ import annotations

import json

from llamacpp_mla_port.jsonfile import write_json


def test_write_json_writes_the_indented_bytes_into_a_new_folder_and_leaves_no_temp(tmp_path):
    data = {"b": [1, 2.5, None], "a": {"ok": True, "name": "é"}}
    dest = tmp_path / "new" / "deeper" / "report.json"
    assert write_json(dest, data, indent=1) == dest
    assert dest.read_bytes() == (json.dumps(data, indent=1) + "\n").encode()
    write_json(dest, [3], indent=2)                      # replaces an existing file
    assert dest.read_text() == json.dumps([3], indent=2) + "\n"
    assert [p.name for p in dest.parent.iterdir()] == ["report.json"]
