"""The docs: docs/configuration.md is what tools/gen_config_docs.py writes from jaxrl_llm/config/sections.py (every
field, its default and its comment), and every relative link in README.md and docs/ leads to a file and
heading that exist."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from jaxrl_llm import config

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "tools" / "gen_config_docs.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


@pytest.fixture(scope="module")
def page():
    return gen.render()


def test_configuration_reference_is_current(page):
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == page, ("docs/configuration.md is stale (a config field or its comment changed): run "
                               f"`{gen.COMMAND}` and commit the result")


def _rows(page):
    """key -> (type, default cell, description) from the page's tables."""
    rows = {}
    for line in page.splitlines():
        cells = [c.strip().replace("\\|", "|").replace("&lt;", "<") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and re.fullmatch(r"`[\w.]+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[4])
    return rows


def _flat(obj, prefix=""):
    """dotted key -> default value, from a Config instance."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def test_every_field_with_its_default_type_and_comment(page):
    rows = _rows(page)
    defaults = _flat(config.Config())
    assert set(rows) == set(defaults)
    for key, value in defaults.items():
        typ, cell, _ = rows[key]
        assert type(value).__name__ in typ.split(" | "), (key, typ)
        if cell == "see below":  # multi-line defaults follow the tables in a text block
            assert f"Default of `{key}`:\n\n```text\n{value}\n```" in page
        else:
            shown = yaml.safe_load(cell.strip("`"))
            assert shown == value and type(shown) is type(value), (key, cell, value)
    # oracle for the descriptions: a plain reading of config/sections.py, each field line's own trailing comment
    section_of = {cls.__name__: name for name, cls in gen.sections(config.Config)}
    cls_name, seen = None, 0
    for line in gen.SOURCE.read_text().splitlines():
        if m := re.match(r"class (\w+)", line):
            cls_name = m[1]
        m = re.match(r"    (\w+): [^#\"']*(?:\"[^\"#]*\"[^#\"']*)?  # (.*)$", line)
        if m and cls_name in section_of:
            key = f"{section_of[cls_name]}.{m[1]}"
            assert m[2].strip() in rows[key][2], key
            seen += 1
    assert seen >= 40
    # a field without a comment points to the field whose comment names it
    pointers = {k: row[2].removeprefix("see `").removesuffix("`") for k, row in rows.items()
                if row[2].startswith("see `")}
    assert len(pointers) >= 5
    for key, other in pointers.items():
        assert key.rsplit(".", 1)[1] in rows[other][2], (key, other)


def test_comments_are_read_with_tokenize_not_by_pattern():
    source = '''
class A:
    """Doc of A,
    two lines."""

    # block above x,
    # second line
    x: int = 1  # beside x
    y: str = "not # a comment"
    z: dict = dict(
        a=1,  # beside z's value
    )
    # a block that ends at a blank line

    w: int = 0
    v: int = 0  # beside v
class B:
    u: int = 0
'''
    fields, docs = gen.field_comments(source)
    assert fields == {
        ("A", "x"): "block above x, second line beside x",
        ("A", "y"): "",
        ("A", "z"): "beside z's value",
        ("A", "w"): "",
        ("A", "v"): "beside v",
        ("B", "u"): "",
    }
    assert docs == {"A": "Doc of A, two lines.", "B": ""}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, inline code removed."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return out


def _anchors(path: Path) -> set[str]:
    anchors, times = set(), {}
    for line in _prose(path.read_text()):
        if m := re.match(r"#{1,6} (.*)", line):
            slug = _slug(m[1])
            anchors.add(f"{slug}-{times[slug]}" if slug in times else slug)  # GitHub numbers repeats
            times[slug] = times.get(slug, 0) + 1
    return anchors


def broken_links(files: list[Path]) -> list[str]:
    """'file: target (why)' for each relative link or image that does not resolve."""
    bad = []
    for path in files:
        for line in _prose(path.read_text()):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                if not dest.exists():
                    bad.append(f"{path}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    bad.append(f"{path}: {target} (no heading #{anchor})")
    return bad


def test_relative_links_resolve():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(files) > 10
    assert broken_links(files) == []


def test_link_check_finds_missing_files_and_headings(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# Title\n\n## Scale-out: the plan (v5e-8)\n\n## Notes\n\n## Notes\n")
    (tmp_path / "a.md").write_text(
        "[ok](sub/b.md) [ok](sub/b.md#scale-out-the-plan-v5e-8) [ok](sub/b.md#notes-1) [ok](#local)\n"
        "# Local\n![missing](img.png) [missing](sub/c.md) [bad anchor](sub/b.md#plan) [web](https://x.org/y)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n")
    assert broken_links([tmp_path / "a.md"]) == [
        f"{tmp_path / 'a.md'}: img.png (no such file)",
        f"{tmp_path / 'a.md'}: sub/c.md (no such file)",
        f"{tmp_path / 'a.md'}: sub/b.md#plan (no heading #plan)",
    ]
