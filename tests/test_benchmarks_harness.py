"""The one harness (``python -m benchmarks``) and the recorded GPU figures the book shows (``utils.recorded``)."""

import json

import matplotlib
import pytest

matplotlib.use("agg")

from benchmarks import __main__ as harness  # noqa: E402
from utils import device, recorded  # noqa: E402
from utils.gpu import hardware  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One CPU smoke run of the harness, recorded to a temporary folder."""
    if device.HAS_CUDA:
        pytest.skip("the smoke mode is for machines without a GPU")
    out = tmp_path_factory.mktemp("record")
    assert harness.main(["--allow-cpu", "--quick", "--record", str(out)]) == 0
    return out


def test_harness_records_json_and_roofline(smoke):
    data = json.loads((smoke / "cpu-smoke.json").read_text())
    assert (smoke / "cpu-smoke-roofline.png").stat().st_size > 10_000
    kernels = [r["kernel"] for r in data["results"]]
    assert kernels[0] == "HBM copy (torch copy_)" and "tiled matmul" in kernels    # part 1's cases
    assert "flash_attention fwd" in kernels and "paged attention decode" in kernels  # part 3's cases
    hopper = ["persistent TMA matmul", "flash_attention_hopper fwd", "flash_attention bwd (fused)"]
    assert kernels.index("paged attention decode") < kernels.index(hopper[0]) and set(hopper) <= set(kernels)
    assert {"persistent softmax", "tiled matmul, autotuned", "exp2 (SFU)"} <= set(kernels)
    assert kernels[-3:] == ["all-reduce (gloo)", "all-gather (gloo)", "reduce-scatter (gloo)"]  # collectives
    assert {"device", "date_utc", "torch", "triton", "cuda", "python"} <= set(data["header"])


def test_the_recording_covers_every_case_of_the_harness(smoke):
    """benchmarks/results/h100-sxm.json must be re-recorded when the harness gains or renames a case."""
    ran = [(r["kernel"], r["unit"]) for r in json.loads((smoke / "cpu-smoke.json").read_text())["results"]
           if not r["kernel"].endswith("(gloo)")]  # collectives: gloo on the CPU; NCCL, with 2+ GPUs, on a GPU
    saved = [(r["kernel"], r["unit"]) for r in recorded.load()["results"]]
    not_recorded = {k for k, _ in set(ran) - set(saved)}
    assert not_recorded <= set(harness.NOT_YET_RECORDED), "record these cases on a GPU, or list them as pending"
    assert not set(harness.NOT_YET_RECORDED) & {k for k, _ in saved}, "recorded now: remove from NOT_YET_RECORDED"
    # GPU-only rows: the SDPA backends a CPU lacks, and fp8 (no fp8 in Triton's interpreter)
    assert {k for k, _ in set(saved) - set(ran)} <= {"SDPA EFFICIENT_ATTENTION", "SDPA CUDNN_ATTENTION", "fp8 matmul"}


def test_the_recording_is_a_full_gpu_run_with_consistent_figures():
    data = recorded.load()
    h = data["header"]
    assert data["on_gpu"] and not data["quick"]
    assert "H100" in h["device"] and h["spec"] == "H100-SXM"
    g = hardware.spec(h["spec"])
    for r in data["results"]:
        assert r["value"] > 0, r
        if r["unit"] not in ("GB/s", "TFLOP/s"):  # the SFUs' exponentials, against their own peak
            assert 0 < r["peak_fraction"] < 1, r
            continue
        rate = r["value"] * (1e9 if r["unit"] == "GB/s" else 1e12)
        peak = g.hbm_bandwidth if r["unit"] == "GB/s" else g.flops("fp8" if "e4m3" in r["shape"] else "fp16")
        assert r["peak_fraction"] == pytest.approx(rate / peak), r["kernel"]
        assert rate < peak, f"{r['kernel']} above the datasheet peak: a timing bug"
        assert r["ratio"] == pytest.approx(r["value"] / r["baseline_value"])
        assert r["verdict"] in ("PASS", "MISS", "n/a")


def test_rows_caption_and_table():
    data = recorded.load()
    softmax = recorded.rows(data, "fused softmax")
    assert [r["shape"] for r in softmax] == ["262144x1024 fp32", "131072x2048 fp32", "65536x4096 fp32",
                                             "32768x8192 fp32"]  # 1 GiB of input each
    assert len(recorded.rows(data, ("rms_norm", "rope"))) == 2
    assert data["header"]["date_utc"][:10] in recorded.caption(data)
    table = recorded.format_rows(softmax)
    assert table.count("\n") == 1 + len(softmax) and "torch.softmax" in table


def test_roofline_places_every_row_with_an_intensity():
    data = recorded.load()
    fig = recorded.plot_roofline(data)
    placed = sum(1 for r in data["results"] if r.get("intensity"))
    assert placed >= 10
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == placed
    matplotlib.pyplot.close(fig)


def test_show_and_bad_names(capsys):
    assert recorded.show("vector add", plot=False)["header"]
    assert "Recorded on an NVIDIA H100" in capsys.readouterr().out
    assert recorded.show("vector add", name="no-such-gpu", plot=False) is None
    assert "no recording" in capsys.readouterr().out
    with pytest.raises(ValueError, match="available"):
        recorded.load("no-such-gpu")
    with pytest.raises(ValueError, match="no recorded row"):
        recorded.plot_rows(recorded.load(), "no such kernel")


def test_show_of_an_unrecorded_kernel_says_so_and_gives_the_published_figure(capsys):
    assert recorded.show("no such kernel", plot=False) is not None
    assert "has no 'no such kernel' rows yet" in capsys.readouterr().out
    recorded.show("no such kernel", plot=False, published="1.2 ms (Someone et al. 2023, Table 4)")
    assert "Published figure for the same measurement: 1.2 ms (Someone et al. 2023, Table 4)" in \
        capsys.readouterr().out
    assert recorded.format_rows([]).count("\n") == 1
