"""The Chinese edition (notebooks/zh/) against the English notebooks: the same code cells and outputs byte for
byte, every markdown cell translated from the current English, nothing left in English, and each notebook exactly
what `python -m course_lib.i18n sync zh` writes. Then the tool itself on a tiny notebook of its own."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib import i18n

LANG = "zh"
ENGLISH = i18n.english_notebooks()
IDS = [p.relative_to(i18n.NOTEBOOKS).with_suffix("").as_posix() for p in ENGLISH]
TARGET = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)|(?:src|href)=\"([^\"]+)\"")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def markdown(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "markdown"]


def test_every_english_notebook_has_a_translation_file():
    assert len(ENGLISH) >= 28
    missing = [str(i18n.text_path(p, LANG)) for p in ENGLISH if not i18n.text_path(p, LANG).exists()]
    assert missing == []


@pytest.mark.parametrize("notebook", ENGLISH, ids=IDS)
def test_code_cells_outputs_and_metadata_equal_the_english(notebook):
    path = i18n.edition_path(notebook, LANG)
    assert path.exists(), f"{path} missing: run python -m course_lib.i18n sync {LANG}"
    en, zh = load(notebook), load(path)
    assert {k: v for k, v in zh.items() if k != "cells"} == {k: v for k, v in en.items() if k != "cells"}
    assert [(c["cell_type"], c["id"]) for c in zh["cells"]] == [(c["cell_type"], c["id"]) for c in en["cells"]]
    for a, b in zip(en["cells"], zh["cells"]):
        if a["cell_type"] == "code":
            assert b == a, f"code cell {a['id']} differs from the English"
        else:  # a markdown cell: its metadata (slideshow) too, only the source is translated
            assert {k: v for k, v in b.items() if k != "source"} == {k: v for k, v in a.items() if k != "source"}


@pytest.mark.parametrize("notebook", ENGLISH, ids=IDS)
def test_every_markdown_cell_is_translated_from_the_current_english(notebook):
    translations = i18n.read_translations(i18n.text_path(notebook, LANG))
    _, problems = i18n.build(notebook, LANG, translations)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("notebook", ENGLISH, ids=IDS)
def test_the_chinese_notebook_is_what_sync_writes(notebook):
    expected, _ = i18n.build(notebook, LANG, i18n.read_translations(i18n.text_path(notebook, LANG)))
    path = i18n.edition_path(notebook, LANG)
    assert path.read_text(encoding="utf-8") == expected, \
        f"{path} was edited by hand or is out of date: edit its text file and run python -m course_lib.i18n sync {LANG}"


@pytest.mark.parametrize("notebook", ENGLISH, ids=IDS)
def test_relative_links_resolve_from_the_chinese_notebook(notebook):
    path = i18n.edition_path(notebook, LANG)
    broken = []
    for cell in markdown(load(path)):
        for m in TARGET.finditer(i18n.cell_source(cell)):
            target = (m.group(1) or m.group(2)).split("#")[0].split("?")[0]
            if target and not re.match(r"[a-z][a-z0-9+.-]*:|/", target) and not (path.parent / target).exists():
                broken.append(f"cell {cell['id']}: {target}")
    assert broken == []


def test_english_cells_of_the_course_count_as_english():
    """The counter's other side: every English markdown cell of the course, the Chinese glossary included, is
    flagged (so a cell a translator skipped cannot pass)."""
    passed = [(p.stem, c["id"]) for p in ENGLISH for c in markdown(load(p))
              if not i18n.looks_english(i18n.cell_source(c))]
    assert passed == []


def test_the_counter_leaves_out_code_formulas_links_and_html():
    cell = ("预填充 (prefill) 一次处理整个提示词。`torch.compile(model, mode=\"reduce-overhead\")`\n"
            "$$\\text{intensity} = \\frac{FLOPs}{bytes}$$ 和 $O(n^2)$，见 [图](../figures/roofline_example.png)"
            " 与 https://docs.vllm.ai/en/latest/serving/metrics.html <img src=\"x.png\" alt=\"a b c\">\n"
            "```python\nfor token in llm.stream(prompt, params): print(token)\n```")
    assert i18n.counts(cell) == (16, 1)  # 16 ideographs (the link text 图 included); "prefill" the one word
    assert not i18n.looks_english(cell)
    assert i18n.looks_english("The prefill reads every weight once for the whole prompt (预填充).")
    assert i18n.looks_english("Solutions: `notebooks/solutions/03_attention_solutions.ipynb`.")
    assert not i18n.looks_english("参考答案：`notebooks/solutions/03_attention_solutions.ipynb`。")
    assert not i18n.looks_english("$$y = W x$$\n\n![](../figures/x.png)")  # nothing to translate
    # A translated cell with one paragraph left in English is caught by that line.
    mixed = "这一章测量预填充与解码在这台机器上的速度，并解释两者为什么不同。" * 3 + \
        "\n\nThe decode step reads every weight of the model once for each token it produces here."
    assert i18n.counts(mixed)[0] > i18n.CJK_PER_WORD * i18n.counts(mixed)[1]
    assert i18n.looks_english(mixed)


# --- the Chinese README and teacher's kit -------------------------------------------------------------------------
README, README_ZH = i18n.ROOT / "README.md", i18n.ROOT / f"README.{LANG}.md"
KIT, KIT_ZH = i18n.NOTEBOOKS / "README.md", i18n.NOTEBOOKS / LANG / "README.md"
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def test_the_readmes_link_each_other_in_their_first_line():
    assert f"(README.{LANG}.md)" in README.read_text(encoding="utf-8").splitlines()[0]
    assert "(README.md)" in README_ZH.read_text(encoding="utf-8").splitlines()[0]
    assert "(zh/README.md)" in KIT.read_text(encoding="utf-8").splitlines()[0]
    assert "(../README.md)" in KIT_ZH.read_text(encoding="utf-8").splitlines()[0]


def test_the_chinese_readme_names_each_chapter_by_its_title_and_links_it():
    """A chapter's title is the same in the README's table and in the chapter's own heading."""
    readme = README_ZH.read_text(encoding="utf-8")
    for chapter in (p for p in ENGLISH if p.parent == i18n.NOTEBOOKS):
        zh = i18n.edition_path(chapter, LANG)
        heading = i18n.cell_source(markdown(load(zh))[0]).splitlines()[0]
        title = re.sub(r"\s*\([^()]*\)$", "", heading.lstrip("# "))  # without "(English title)"
        assert f"[{title}](notebooks/{LANG}/{chapter.name})" in readme, f"{chapter.name}: {title!r} not in the table"


def test_the_glossary_of_both_readmes_is_the_same():
    def glossary(path: Path) -> list[str]:
        rows = path.read_text(encoding="utf-8").split("| English | 中文 |")[1].split("\n\n")[0]
        return rows.strip().splitlines()
    assert glossary(README_ZH) == glossary(README) and len(glossary(README)) > 20


def test_the_chinese_kit_quotes_the_same_numbers():
    """Every number of the English teacher's kit (timings, bytes, ratios) is in the Chinese one as often, and no
    other: code spans left out, since both quote the same commands."""
    def numbers(path: Path) -> list[str]:
        return sorted(NUMBER.findall(i18n.CODE.sub(" ", path.read_text(encoding="utf-8"))))
    assert numbers(KIT_ZH) == numbers(KIT)


# --- the tool on a notebook of its own ---------------------------------------------------------------------------
def _cell(kind: str, cell_id: str, source: str) -> dict:
    cell = {"cell_type": kind, "id": cell_id, "metadata": {"slideshow": {"slide_type": "slide"}},
            "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=1, outputs=[{"name": "stdout", "output_type": "stream", "text": ["2\n"]}])
    return cell


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A course of one chapter and its solutions in tmp_path, with i18n pointed at it."""
    notebooks = tmp_path / "notebooks"
    (notebooks / "solutions").mkdir(parents=True)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "p.png").write_bytes(b"\x89PNG")
    (tmp_path / "README.md").write_text("# course\n")
    (tmp_path / "README.zh.md").write_text("# 课程\n")
    chapter = {"cells": [
        _cell("markdown", "title", "# 01 · Title\nSee ![a plot](../figures/p.png), [the README](../README.md#start)"
              " and [the solutions](solutions/01_x_solutions.ipynb)."),
        _cell("code", "code1", "print(1 + 1)"),
        _cell("markdown", "body", "Some English words to translate here."),
        _cell("markdown", "new", "A cell nobody has translated yet.")],
        "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    solutions = {"cells": [_cell("markdown", "s1", "Back to [the chapter](../01_x.ipynb), "
                                 "[a figure](../../figures/p.png).")], "metadata": {}, "nbformat": 4,
                 "nbformat_minor": 5}
    for path, nb in [(notebooks / "01_x.ipynb", chapter), (notebooks / "solutions" / "01_x_solutions.ipynb",
                                                           solutions)]:
        path.write_text(i18n.dump(nb), encoding="utf-8")
    monkeypatch.setattr(i18n, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(i18n, "ROOT", tmp_path)
    cells = {c["id"]: i18n.cell_source(c) for c in chapter["cells"]}
    i18n.write_translations(i18n.text_path(notebooks / "01_x.ipynb", LANG), [
        i18n.Translation("title", i18n.en_hash(cells["title"]), "# 01 · 标题\n见 ![图](../figures/p.png)、"
                         "[说明](../README.md#start) 和 [参考答案](solutions/01_x_solutions.ipynb)。"),
        i18n.Translation("body", i18n.en_hash("Older English words."), "需要翻译的一些旧的英文词语。"),
        i18n.Translation("gone", "0" * 12, "英文里已经删掉的一格。")])
    i18n.write_translations(i18n.text_path(notebooks / "solutions" / "01_x_solutions.ipynb", LANG), [
        i18n.Translation("s1", i18n.en_hash(i18n.cell_source(solutions["cells"][0])),
                         "回到[本章](../01_x.ipynb)，[一张图](../../figures/p.png)。")])
    return tmp_path


def test_sync_reports_stale_missing_and_dropped_cells_and_adds_the_missing_english(course):
    problems = i18n.sync(LANG)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == [
        "cell body stale", "cell new missing", "cell gone has no English cell any more"]
    text = i18n.read_translations(course / "notebooks" / LANG / "text" / "01_x.md")
    assert list(text) == ["title", "body", "new"]  # in the English order, the dropped cell gone
    assert text["new"].text == "A cell nobody has translated yet." and \
        text["new"].en_hash == i18n.en_hash("A cell nobody has translated yet.")
    # Now the added cell is listed as English, and status agrees with what sync wrote.
    after = i18n.sync(LANG, write=False)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in after] == ["cell body stale", "cell new still English"]


def test_sync_copies_code_and_rewrites_links(course):
    i18n.sync(LANG)
    en = load(course / "notebooks" / "01_x.ipynb")
    zh = load(course / "notebooks" / LANG / "01_x.ipynb")
    assert zh["cells"][1] == en["cells"][1] and zh["metadata"] == en["metadata"]
    assert i18n.cell_source(zh["cells"][0]) == ("# 01 · 标题\n见 ![图](../../figures/p.png)、[说明](../../README.zh.md#start)"
                                                " 和 [参考答案](solutions/01_x_solutions.ipynb)。")
    assert i18n.cell_source(zh["cells"][2]) == "需要翻译的一些旧的英文词语。"  # stale: still used, and listed
    solution = load(course / "notebooks" / LANG / "solutions" / "01_x_solutions.ipynb")
    assert i18n.cell_source(solution["cells"][0]) == "回到[本章](../01_x.ipynb)，[一张图](../../../figures/p.png)。"
    assert (course / "notebooks" / LANG / "solutions" / "../../../figures/p.png").exists()


def test_status_lists_a_hand_edited_notebook_and_a_clean_edition_passes(course):
    i18n.sync(LANG)
    path = course / "notebooks" / LANG / "text" / "01_x.md"
    text = path.read_text(encoding="utf-8").replace(i18n.en_hash("Older English words."),
                                                    i18n.en_hash("Some English words to translate here."))
    path.write_text(text.replace("A cell nobody has translated yet.", "一个还没有人翻译过的单元格。"), encoding="utf-8")
    assert i18n.sync(LANG) == []
    out = course / "notebooks" / LANG / "01_x.ipynb"
    out.write_text(out.read_text(encoding="utf-8").replace("标题", "标题!"), encoding="utf-8")
    assert i18n.sync(LANG, write=False) == [f"notebooks/{LANG}/01_x.ipynb: not what sync writes (run sync)"]
    assert i18n.main(["sync", LANG]) == 0 and i18n.main(["status", LANG]) == 0
