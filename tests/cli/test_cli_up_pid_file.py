"""`salon up` replaces a child's pid file by rename: a reader racing a restart reads the old pid or the new
one, never the empty file that truncating in place shows between the truncate and the write."""

from __future__ import annotations

import os

from salon.cli.up import write_pid_file


def test_pid_file_is_replaced_whole_never_truncated(tmp_path):
    path = tmp_path / "kvstore.pid"
    write_pid_file(path, 1234)
    assert path.read_text() == "1234\n"
    with path.open() as old:  # a reader that opened the file before the restart
        write_pid_file(path, 56789)
        # Truncate-and-write would change this very file (the reader would see "" or "56789\n").
        assert old.read() == "1234\n"
    assert path.read_text() == "56789\n"
    assert sorted(os.listdir(tmp_path)) == ["kvstore.pid"]  # no temporary left behind
