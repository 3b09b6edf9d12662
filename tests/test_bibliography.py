"""The bibliography: references.bib parses, every entry is cited, every citation resolves, the
primary sources the book teaches from are present, and every paper a chapter names by its arXiv
identifier is in the bibliography and cited on that page.

Sphinx (-W) already fails the book on a {cite} of an unknown key; these checks run in a second
without a build and also catch what Sphinx does not: an entry nobody cites (it silently drops out
of the bibliography page) and a paper named in the prose with no citation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parent.parent
BIB = parse_file(str(ROOT / "references.bib"), bib_format="bibtex")
CHAPTERS = sorted(p for p in (ROOT / "chapters").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
LABS = sorted(p for p in (ROOT / "labs").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
PAGES_MD = sorted(ROOT.glob("*.md"))
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")

# Papers a chapter names by arXiv id that it does not cite yet, with the page. Only for pages that
# this branch could not edit; the test below fails as soon as one of them is cited, so that the
# entry is removed from here at the same time.
NOT_YET_CITED: dict[str, str] = {}

# The primary sources the book teaches from (issue 13), by arXiv id where they have one.
REQUIRED_ARXIV = {
    "1910.02054": "ZeRO",
    "1909.08053": "Megatron-LM (2019)",
    "2104.04473": "Megatron-LM at scale (2021)",
    "2205.05198": "sequence parallelism and selective recomputation (2022)",
    "1811.06965": "GPipe",
    "1710.03740": "mixed-precision training",
    "2205.14135": "FlashAttention",
    "2307.08691": "FlashAttention-2",
    "2407.08608": "FlashAttention-3",
    "2309.06180": "vLLM / PagedAttention",
    "1911.02150": "multi-query attention",
    "2305.13245": "grouped-query attention",
    "2405.04434": "DeepSeek-V2",
    "2412.19437": "DeepSeek-V3",
    "2104.09864": "RoPE (RoFormer)",
    "2002.05202": "GLU variants",
    "1910.07467": "RMSNorm",
    "2203.02155": "InstructGPT",
    "1707.06347": "PPO",
    "2305.18290": "DPO",
    "2402.03300": "GRPO (DeepSeekMath)",
}
# ... and by title where they have none (a substring of the entry's title without BibTeX's braces,
# case-insensitive).
REQUIRED_TITLES = {
    "PipeDream: Generalized Pipeline Parallelism": "PipeDream (SOSP 2019)",
    "Reinforcement Learning: An Introduction": "Sutton & Barto",
    "NVIDIA H100 Tensor Core GPU Architecture": "H100 whitepaper",
    "NVIDIA H100 Tensor Core GPU Datasheet": "H100 datasheet",
    "CUDA C++ Programming Guide": "CUDA C++ Programming Guide",
    "CUDA C++ Best Practices Guide": "CUDA C++ Best Practices Guide",
    "Matrix Multiplication Background": "NVIDIA Matrix Multiplication Background guide",
}


def _markdown_of(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _cited(text: str) -> set[str]:
    return {key.strip() for m in CITE.finditer(text) for key in m.group(1).split(",")}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


TEXTS = {_rel(p): _markdown_of(p) for p in CHAPTERS + LABS + PAGES_MD}
CITED_WHERE = {key: sorted(page for page, text in TEXTS.items() if key in _cited(text))
               for key in BIB.entries}
BY_ARXIV = {entry.fields["eprint"]: key for key, entry in BIB.entries.items() if "eprint" in entry.fields}


def test_bibliography_is_in_the_book():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["bibtex_bibfiles"] == ["references.bib"]
    assert "{bibliography}" in (ROOT / "bibliography.md").read_text()
    assert "file: bibliography" in (ROOT / "_toc.yml").read_text()


def test_download_button_is_on():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["config"]["html_theme_options"]["use_download_button"] is True
    assert config["sphinx"]["recursive_update"] is True, "without it the theme options replace jupyter-book's"


@pytest.mark.parametrize("key", sorted(BIB.entries))
def test_entry_is_complete_and_cited(key):
    fields = BIB.entries[key].fields
    assert fields.get("title"), f"{key} has no title"
    assert fields.get("year") or fields.get("url"), f"{key} has neither a year nor a URL"
    if "eprint" in fields:
        assert re.fullmatch(r"\d{4}\.\d{4,5}", fields["eprint"]), f"{key}: eprint is not an arXiv id"
        assert fields.get("archiveprefix") == "arXiv", f"{key}: eprint without archiveprefix = arXiv"
    assert CITED_WHERE[key], f"{key} is in references.bib but no page cites it with {{cite}}"


def test_every_citation_resolves():
    unknown = {page: sorted(_cited(text) - set(BIB.entries)) for page, text in TEXTS.items()}
    assert not {page: keys for page, keys in unknown.items() if keys}


@pytest.mark.parametrize("arxiv_id", sorted(REQUIRED_ARXIV))
def test_required_paper_is_present(arxiv_id):
    assert arxiv_id in BY_ARXIV, f"{REQUIRED_ARXIV[arxiv_id]} (arXiv:{arxiv_id}) is missing from references.bib"


@pytest.mark.parametrize("title", sorted(REQUIRED_TITLES))
def test_required_source_is_present(title):
    titles = [re.sub(r"[{}]", "", entry.fields["title"]).lower() for entry in BIB.entries.values()]
    assert any(title.lower() in t for t in titles), f"{REQUIRED_TITLES[title]} is missing from references.bib"


@pytest.mark.parametrize("chapter", [_rel(p) for p in CHAPTERS])
def test_chapter_cites_the_papers_it_names(chapter):
    text = TEXTS[chapter]
    cited = _cited(text)
    missing = []
    for arxiv_id in sorted(set(ARXIV.findall(text))):
        if NOT_YET_CITED.get(arxiv_id) == chapter:
            continue
        key = BY_ARXIV.get(arxiv_id)
        if key is None or key not in cited:
            missing.append(f"arXiv:{arxiv_id} ({key or 'no entry in references.bib'})")
    assert not missing, f"{chapter} names papers it does not cite: {missing}"


@pytest.mark.parametrize("arxiv_id", sorted(NOT_YET_CITED))
def test_not_yet_cited_list_is_current(arxiv_id):
    page = NOT_YET_CITED[arxiv_id]
    text = TEXTS[page]
    assert f"arXiv:{arxiv_id}" in text, f"{page} no longer names arXiv:{arxiv_id}: remove it from NOT_YET_CITED"
    key = BY_ARXIV.get(arxiv_id)
    assert key is None or key not in _cited(text), f"{page} now cites {key}: remove it from NOT_YET_CITED"
