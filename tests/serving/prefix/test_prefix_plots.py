"""Figures of the prefix-caching chapter: they draw, the story is right, the animation has its alt texts."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.serving.prefix import prefix_plots  # noqa: E402
from utils.serving.prefix.prefix_plots import (STORY, WORDS, capacity_curve, describe_frame, plot_block_size,  # noqa: E402
                                        plot_capacity, radix_animation, radix_story)


def test_plots_return_figures():
    for fig in (plot_block_size(block_sizes=(1, 16)), plot_capacity("agent", 64)):
        assert isinstance(fig, Figure)
        plt.close(fig)
    with pytest.raises(ValueError, match="unknown workload"):
        plot_capacity("batch")


def test_capacity_curve_reaches_the_unbounded_hit_rate():
    capacities, block, radix = capacity_curve("few-shot", 16)
    assert capacities[0] >= 1 and list(capacities) == sorted(capacities)
    assert 0 <= block.min() and radix.max() <= 1
    assert radix[-1] >= block[-1]  # with room for everything, token granularity finds at least as much


def test_story_frames_follow_the_tree():
    frames = radix_story(capacity_tokens=20)
    finishes = sum(1 for event in STORY if event[0] == "finish")
    arrivals = len(STORY) - finishes
    evictions = [f for f in frames if any(m == "evict" for m in f.marks.values())]
    assert len(frames) == 1 + arrivals + finishes + len(evictions)
    assert evictions, "the story should run out of room once"
    assert all(f.total_tokens <= f.capacity_tokens for f in frames)
    last = frames[-1]
    # every sequence the tree holds at the end is a prefix of some request's prompt + output
    whole = [tuple(WORDS.index(w) for w in (p + " " + o).split()) for e, _, p, o in STORY if e == "arrive"]
    by_id = {n.id: n for n in last.nodes}

    def spelled(node):
        return (spelled(by_id[node.parent]) if node.parent in by_id else ()) + node.tokens

    for node in last.nodes:
        assert any(w[:len(spelled(node))] == spelled(node) for w in whole)
    assert all(n.lock_ref == 0 for n in last.nodes), "every request has finished and unlocked"
    assert sum(len(n.tokens) for n in last.nodes) == last.total_tokens


def test_animation_has_an_alt_text_per_frame_and_a_labelled_slider():
    frames = radix_story()[:3]
    page = radix_animation(frames, interval_ms=500).data
    assert re.search(r'<img id="_anim_img\w+" alt="Radix tree', page)
    assert re.search(r'<label for="_anim_slider\w+">', page)
    for frame in frames:
        assert describe_frame(frame).replace('"', '\\"') in page  # each frame's alt text, as a JSON string
    with pytest.raises(ValueError, match="empty"):
        prefix_plots.radix_animation([])
