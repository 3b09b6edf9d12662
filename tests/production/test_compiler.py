"""Tests of utils.production.compiler: Dynamo's graphs, the op and byte counts, the generated-code parser, the chain model."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
import torch

from utils.attention.llama import rms_norm
from utils.gpu import hardware
from utils.gpu.overhead import CUDA_GRAPHS_BLOG
from utils.production import compiler as cc

# The shape of a module Inductor writes on a CPU (torch 2.x), cut down: two kernels, a library call, three buffers.
GENERATED = '''
cpp_fused_add_mean_mul_pow_rsqrt_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C"  void  kernel(const float* in_ptr0, float* out_ptr0)
{
    for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(1L))
    {
        float tmp_acc0 = 0;
        at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
        for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(512L); x1+=static_cast<int64_t>(16L))
        {
            auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x1 + 512L*x0), static_cast<int64_t>(16));
            tmp_acc0_vec = tmp_acc0_vec + tmp0;
        }
        tmp_acc0 = tmp_acc0 + at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return x + y; }, tmp_acc0_vec);
        out_ptr0[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
    }
}
\'\'\')


cpp_fused_mul_silu_1 = async_compile.cpp_pybinding(['float*'], r\'\'\'
extern "C"  void  kernel(float* in_out_ptr0) { }
\'\'\')


async_compile.wait(globals())

class Runner:
    def call(self, args):
        arg0_1, arg1_1 = args
        buf0 = empty_strided_cpu((64, 1), (1, 64), torch.float32)
        cpp_fused_add_mean_mul_pow_rsqrt_0(arg0_1, buf0)
        buf1 = empty_strided_cpu((64, 256), (256, 1), torch.float32)
        extern_kernels.mm(arg0_1, arg1_1, out=buf1)
        buf2 = empty_strided_cpu((8, ), (1, ), torch.float32)
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf1, buf1, buf1)
        cpp_fused_mul_silu_1(buf1)
        return (buf1, )
'''


def test_graph_recorder_keeps_each_graph_and_runs_it_unchanged():
    torch._dynamo.reset()
    recorder = cc.GraphRecorder()
    fn = torch.compile(rms_norm, backend=recorder)
    x, w = torch.randn(4, 8), torch.randn(8)
    torch.testing.assert_close(fn(x, w), rms_norm(x, w), rtol=0, atol=0)
    assert recorder.operations() == [".float", ".pow", ".mean", "add", "rsqrt", "mul", ".to", "mul"]
    assert recorder.symbolic_inputs() == []
    fn(torch.randn(5, 8), w)  # a new length: recompiled once, with the length symbolic
    assert len(recorder.graphs) == 2 and len(recorder.symbolic_inputs()) == 1
    fn(torch.randn(9, 8), w)
    assert len(recorder.graphs) == 2


def test_explain_counts_a_graph_break_at_item_and_none_without_it():
    def branchy(x):
        y = x.sin()
        if y.sum().item() > 0:  # either way, an operation follows the break: a second graph
            y = y * 2
        return y + 1

    for x in (torch.ones(8), -torch.ones(8)):
        e = cc.explain(branchy, x)
        assert (e.graphs, e.breaks) == (2, 1) and "item" in e.reasons[0]
    e = cc.explain(branchy, torch.randn(8))
    assert (e.graphs, e.breaks) == (2, 1) and "item" in e.reasons[0]
    e = cc.explain(lambda x: torch.where(x.sum() > 0, x.sin() * 2, x.sin()), torch.randn(8))
    assert (e.graphs, e.breaks, e.reasons) == (1, 0, ())


def test_count_aten_ops_sees_every_operation():
    x = torch.randn(4, 8)
    ops = cc.count_aten_ops(lambda t: (t * 2).sum().view(1), x)
    assert ops == {"mul": 1, "sum": 1, "view": 1}


def test_eager_traffic_counts_inputs_and_outputs_of_non_view_ops():
    x, y = torch.randn(100), torch.randn(100)
    assert cc.eager_traffic_bytes(lambda a, b: a + b, x, y) == 3 * 400
    assert cc.eager_traffic_bytes(lambda a, b: (a + b).view(10, 10), x, y) == 3 * 400  # the view moves nothing
    # a chain of k ops on one tensor: 2 tensors per op
    assert cc.eager_traffic_bytes(lambda a: a.sin().cos().exp(), x) == 3 * 2 * 400
    assert cc.eager_traffic_bytes(lambda a: a.to(torch.float64), x) == 400 + 800


def test_generated_code_parser():
    code = cc.GeneratedCode(GENERATED)
    assert code.kernels == ["cpp_fused_add_mean_mul_pow_rsqrt_0", "cpp_fused_mul_silu_1"]
    assert code.calls == ["cpp_fused_add_mean_mul_pow_rsqrt_0", "extern:mm",
                          "aten:_scaled_dot_product_flash_attention_for_cpu", "cpp_fused_mul_silu_1"]
    assert code.buffers == [(64, 1), (64, 256), (8,)]
    assert code.kernel("silu") == "cpp_fused_mul_silu_1"
    assert code.kernel("rsqrt", "mean") == "cpp_fused_add_mean_mul_pow_rsqrt_0"
    with pytest.raises(ValueError, match="0 kernels fuse"):
        code.kernel("softmax")
    with pytest.raises(ValueError, match="2 kernels fuse"):
        code.kernel("mul")
    assert "void  kernel(float* in_out_ptr0)" in code.kernel_source("cpp_fused_mul_silu_1")
    with pytest.raises(ValueError, match="no kernel named"):
        code.kernel_source("cpp_fused_nothing_9")


def test_kernel_outline_keeps_loops_loads_reductions_and_stores():
    source = cc.GeneratedCode(GENERATED).kernel_source("cpp_fused_add_mean_mul_pow_rsqrt_0")
    assert cc.kernel_outline(source) == [
        "for(int64_t x0=0; x0<64; x0+=1)",
        "    float tmp_acc0 = 0;",
        "    for(int64_t x1=0; x1<512; x1+=16)",
        "        auto tmp0 = load(in_ptr0 + x1 + 512*x0, 16);",
        "        tmp_acc0_vec = tmp_acc0_vec + tmp0;",
        "    tmp_acc0 = tmp_acc0 + sum_lanes(tmp_acc0_vec);",
        "    out_ptr0[x0] = tmp_acc0;",
    ]
    assert cc.kernel_outline("int x = 1;") == []


def test_break_even_calls():
    assert cc.break_even_calls(10.0, 3e-3, 1e-3) == pytest.approx(5000)
    assert cc.break_even_calls(10.0, 1e-3, 1e-3) == math.inf
    assert cc.break_even_calls(10.0, 1e-3, 2e-3) == math.inf
    with pytest.raises(ValueError, match="compile_seconds"):
        cc.break_even_calls(0, 1e-3, 1e-3)


def test_chain_seconds_regimes():
    host, floor = 5e-6, CUDA_GRAPHS_BLOG["kernel_seconds"].value
    bandwidth = hardware.spec("H100-SXM").hbm_bandwidth
    # small tensors: eager is the host's launches, a graph leaves the GPU's short kernels, fusion one launch
    assert cc.chain_seconds(1e3, 8, "eager", host_seconds=host) == pytest.approx(8 * host)
    assert cc.chain_seconds(1e3, 8, "eager + CUDA graph", host_seconds=host) == pytest.approx(8 * floor)
    assert cc.chain_seconds(1e3, 8, "fused", host_seconds=host) == pytest.approx(host)
    assert cc.chain_seconds(1e3, 8, "fused + CUDA graph", host_seconds=host) == pytest.approx(host)
    # large tensors: memory-bound, fusion divides by the chain's length, graphs change nothing
    n = 1e9
    eager = cc.chain_seconds(n, 8, "eager")
    assert eager == pytest.approx(8 * 2 * n * 2 / bandwidth)
    assert cc.chain_seconds(n, 8, "eager + CUDA graph") == pytest.approx(eager)
    assert eager / cc.chain_seconds(n, 8, "fused") == pytest.approx(8)
    with pytest.raises(ValueError, match="mode must be one of"):
        cc.chain_seconds(1e3, 8, "compiled")
    with pytest.raises(ValueError, match="n_ops"):
        cc.chain_seconds(1e3, 0, "eager")


def test_plot_chain_seconds_draws_the_four_modes():
    fig = cc.plot_chain_seconds(n_ops=4, host_us=2.0)
    labels = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert labels == list(cc.MODES)
    plt.close(fig)
    with pytest.raises(ValueError, match="host_us"):
        cc.plot_chain_seconds(host_us=0)
