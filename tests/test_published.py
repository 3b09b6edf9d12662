"""utils.published: every published figure in the package is one Published, with its unit and source."""

import pytest

from utils.gpu import memory_hierarchy
from utils.parallel import memory, training
from utils.parallel.comm import topology
from utils.published import KINDS, Published


def _every_figure():
    yield from training.PUBLISHED.values()
    yield from topology.PUBLISHED.values()
    for figures in memory_hierarchy.PUBLISHED.values():
        yield from figures.values()
    yield from (row[-1] for row in memory.ZERO_PAPER_FIGURES)
    yield from (figure for _, figure in memory.ZERO_PAPER_LARGEST_MODELS_64_GPUS)


def test_every_table_holds_published_figures_with_a_source():
    figures = list(_every_figure())
    assert len(figures) > 40
    for figure in figures:
        assert type(figure) is Published
        assert figure.source.strip() and figure.unit.strip() and figure.value > 0
        assert figure.kind is None or figure.kind in KINDS


@pytest.mark.parametrize("kwargs, match", [
    (dict(value=1, unit="GPUs", source=""), "source"),
    (dict(value=1, unit="", source="a datasheet"), "unit"),
    (dict(value=1, unit="GPUs", source="a datasheet", kind="rumoured"), "kind"),
])
def test_a_figure_without_source_unit_or_a_known_kind_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Published(**kwargs)


def test_published_figures_are_frozen():
    figure = Published(8, "GPUs per node", "NVIDIA DGX H100 User Guide")
    with pytest.raises(AttributeError):
        figure.value = 16
