"""utils/atomic.py: a folder replaces its target whole, or the target stays as it was."""

import pytest

from jaxrl_llm.utils.atomic import atomic_folder


def test_a_folder_replaces_its_target_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out" / "final"
    with atomic_folder(target) as folder:  # parents made; nothing at the target while it is written
        assert folder.is_dir() and not target.exists() and list(folder.iterdir()) == []
        (folder / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(KeyboardInterrupt):  # killed half-way: the old folder whole, no partial left
        with atomic_folder(target) as folder:
            (folder / "a").write_text("torn")
            raise KeyboardInterrupt
    assert (target / "a").read_text() == "1" and sorted(p.name for p in target.parent.iterdir()) == ["final"]
    (target.parent / ".final.partial").mkdir()  # left by a process killed at the rename
    (target.parent / ".final.partial" / "junk").write_text("x")
    with atomic_folder(target) as folder:
        assert list(folder.iterdir()) == []
        (folder / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]  # the old files go with the old folder
    assert sorted(p.name for p in target.parent.iterdir()) == ["final"]
    file_target = tmp_path / "file"
    file_target.write_text("x")
    with atomic_folder(file_target) as folder:
        (folder / "c").write_text("3")
    assert (file_target / "c").read_text() == "3"
