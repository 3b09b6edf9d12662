"""Trace timelines: reading Chrome traces (hand-made and torch.profiler's), depths, self times, merging, the SVG."""

import re

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from utils.production import trace_timeline as tt


def _trace(events, base_ns=0):
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}}]
    return {"traceEvents": meta + [{"ph": "X", "pid": 1, "tid": 7, **e} for e in events], "baseTimeNanoseconds": base_ns}


STEP = _trace([  # forward [0, 100) holds linear [10, 60) which holds addmm [20, 50); backward [100, 300)
    {"name": "forward", "cat": "user_annotation", "ts": 0, "dur": 100},
    {"name": "aten::linear", "cat": "cpu_op", "ts": 10, "dur": 50},
    {"name": "aten::addmm", "cat": "cpu_op", "ts": 20, "dur": 30},
    {"name": "backward", "cat": "user_annotation", "ts": 100, "dur": 200},
    {"name": "gloo:all_reduce", "cat": "cpu_op", "ts": 150, "dur": 40},
    {"name": "aten::addmm", "cat": "cpu_op", "ts": 200, "dur": 50},
], base_ns=5_000)


def test_depths_lanes_and_absolute_times():
    events = tt.read_chrome_trace(STEP)
    assert [(e.name, e.depth) for e in events] == [
        ("forward", 0), ("aten::linear", 1), ("aten::addmm", 2), ("backward", 0), ("gloo:all_reduce", 1),
        ("aten::addmm", 1)]
    assert {e.lane for e in events} == {"main"}
    assert events[0].start_us == 5.0 and events[3].end_us == 305.0  # ts + baseTimeNanoseconds / 1000


def test_self_times_subtract_direct_children_only():
    """forward 100 - 50 (linear) = 50; linear 50 - 30 = 20; addmm 30 + 50; backward 200 - 40 - 50 = 110."""
    assert tt.self_times(tt.read_chrome_trace(STEP)) == {
        "backward": (110.0, 1), "aten::addmm": (80.0, 2), "forward": (50.0, 1), "gloo:all_reduce": (40.0, 1),
        "aten::linear": (20.0, 1)}
    assert tt.lane_busy_us(tt.read_chrome_trace(STEP)) == {"main": 300.0}


def test_merge_keeps_each_rank_in_its_lanes_on_a_shared_clock():
    rank0 = tt.read_chrome_trace(STEP)
    rank1 = tt.read_chrome_trace(_trace([{"name": "backward", "cat": "user_annotation", "ts": 0, "dur": 50}],
                                        base_ns=95_000))
    merged = tt.merge({"rank 0": rank0, "rank 1": rank1})
    assert sorted({e.lane for e in merged}) == ["rank 0: main", "rank 1: main"]
    late = next(e for e in merged if e.lane.startswith("rank 1"))
    assert (late.start_us, late.depth) == (95.0, 0)  # rank 1's clock starts 90 us after rank 0's
    with pytest.raises(ValueError, match="at least one trace"):
        tt.merge({})


def test_the_svg_draws_every_bar_with_a_tooltip_and_escapes_names():
    events = tt.read_chrome_trace(_trace([{"name": "a<b>&c", "cat": "cpu_op", "ts": 0, "dur": 10},
                                          {"name": "ncclKernel_AllReduce", "cat": "kernel", "ts": 10, "dur": 5}]))
    svg = tt.timeline_html(events, title="two events")
    assert svg.count("<rect") == 2 and svg.count("<title>") == 2
    assert "a&lt;b&gt;&amp;c" in svg and "a<b>" not in svg
    assert tt.CATEGORY_COLOURS["communication"] in svg  # the NCCL kernel is drawn as communication
    assert 'role="img"' in svg and 'aria-label="two events: 2 events on 1 lanes' in svg


def test_depth_and_window_leave_events_out_and_say_so():
    events = tt.read_chrome_trace(STEP)
    shallow = tt.timeline_html(events, max_depth=0)
    assert shallow.count("<rect") == 2 and "4 deeper or outside the window left out" in shallow
    windowed = tt.timeline_html(events, start_us=105, end_us=305)
    assert windowed.count("<rect") == 3  # backward and its two children
    assert re.search(r"<text[^>]*>0 ms</text>", windowed)


def test_a_torch_profiler_trace_reads_back(tmp_path):
    model = torch.nn.Linear(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            loss = model(torch.randn(4, 16)).sum()
        with record_function("backward"):
            loss.backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = tt.read_chrome_trace(path, lane_prefix="rank 0: ")
    names = {e.name for e in events}
    assert {"forward", "backward", "aten::linear"} <= names
    forward = next(e for e in events if e.name == "forward")
    linear = next(e for e in events if e.name == "aten::linear")
    assert forward.depth == 0 and linear.depth > forward.depth and forward.start_us <= linear.start_us
    assert all(e.lane.startswith("rank 0: ") for e in events)
    assert "<rect" in tt.timeline_html(events)


@pytest.mark.parametrize("call, message", [
    (lambda: tt.read_chrome_trace({"events": []}), "'traceEvents' list"),
    (lambda: tt.read_chrome_trace(42), "path to a Chrome trace JSON file or its loaded dict"),
    (lambda: tt.read_chrome_trace(_trace([{"name": "x", "ts": 0, "dur": -1}])), "negative duration"),
    (lambda: tt.timeline_html([]), "no events to draw"),
    (lambda: tt.timeline_html(tt.read_chrome_trace(STEP), start_us=10, end_us=10), "end_us - start_us"),
    (lambda: tt.timeline_html(tt.read_chrome_trace(STEP), start_us=1e6, end_us=2e6), "no event between"),
    (lambda: tt.timeline_html(tt.read_chrome_trace(STEP), width=0), "width must be a positive int"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_profilers_own_span_is_left_out_and_processes_named_when_several():
    trace = _trace([{"name": "forward", "cat": "user_annotation", "ts": 0, "dur": 10}])
    trace["traceEvents"].append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                 "tid": "PyTorch Profiler", "ts": 0, "dur": 20})
    assert [e.name for e in tt.read_chrome_trace(trace)] == ["forward"]
    kept = tt.read_chrome_trace(trace, keep_profiler_spans=True)
    assert sorted(e.lane for e in kept) == ["process Spans / thread PyTorch Profiler", "python / main"]
