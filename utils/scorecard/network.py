"""Scorecard rows of the network models (part 2, chapters 2 and 5): ``collectives``: what NCCL reaches (:func:`~utils.parallel.comm.nccl_allreduce.nccl_allreduce_time`:
a fixed cost per call, then the protocol NCCL's own tuning model picks for
the size (LL, LL128 or Simple: its latency plus the bytes each GPU sends at
that protocol's share of a fitted fraction of the NVLink line rate), turned into nccl-tests' bus bandwidth
(:mod:`utils.parallel.comm.bandwidth`), against published all-reduce sweeps on
one 8-GPU NVSwitch node. Each row uses the algorithm the source says NCCL ran:
the ring, or NVLink SHARP (NVLS). Link bandwidth is half the spec's two-way
NVLink figure. Fit rows: the H100 ring and NVLS plateaus of NVIDIA/nccl-tests
issue 212 (the two link efficiencies) and the A100 sweep's 32 KiB row (the base
latency). Holdout: the rest of the A100 sweep and the whole H200 sweep.

``network_topology``: the Clos calculator of :mod:`utils.parallel.comm.topology`
against NVIDIA's published SuperPOD switch counts and Al-Fares's fat tree:
chapter 5's check, one row per fabric.
"""

from __future__ import annotations

from functools import partial

from utils.gpu import hardware as _hardware
from utils.parallel.comm import bandwidth as _bandwidth
from utils.parallel.comm import nccl_allreduce as _nccl
from utils.parallel.comm import topology as _topology
from utils.scorecard.record import Entry

KIB, MIB, GIB = 2**10, 2**20, 2**30
STAS_A100 = ("stas00/ml-engineering, network/README.md at commit d28da7a4, 'Real network throughput': nccl-tests "
             "all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50 on a single A100 node (NVLink 300 GB/s each way)")
STAS_H200 = ("stas00/ml-engineering, network/benchmarks/results/all-reduce-8xH200.md at commit c53741b8 "
             "(all_reduce_bench.py, torch 2.9.1, NCCL 2.27.7, 8x H200 SXM, NVLink 4; NCCL's Ring/LL up to 1 MiB, "
             "NVLS/SIMPLE from 2 MiB, as the file states)")
A100_BUSBW = ((32 * KIB, 1.31), (1 * MIB, 18.00), (16 * MIB, 106.16), (64 * MIB, 171.54), (256 * MIB, 194.07),
              (1 * GIB, 229.04), (16 * GIB, 234.89))
"""(bytes, busbw GB/s) of the A100 sweep, every fourth size or so from 32 KiB to 16 GiB."""
H200_BUSBW = ((32 * KIB, 1.44, "ring"), (1 * MIB, 39.93, "ring"), (16 * MIB, 219.89, "nvls"),
              (256 * MIB, 436.15, "nvls"), (1 * GIB, 463.58, "nvls"), (16 * GIB, 482.26, "nvls"))
STAS_H100_FIT = ("NVIDIA/nccl-tests issue 212, S. Jeaugey's answers of 2024-05-06 (ring ~370 GB/s busbw on 8 H100, "
                 "\"a peak busBw of ~480GB/s (algbw ~275GB/s)\" with NVLS, at large sizes); NVIDIA/nccl issue 1455 "
                 "(8 H100 SXM, all_reduce_perf -b 2G -e 4G: ring 365-370, NVLS 480 GB/s at 8 GPUs)")
H100_FIT_BUSBW = ((4 * GIB, 370.0, "ring"), (4 * GIB, 480.0, "nvls"))
_RING_OMITS = ("NCCL's channel count chosen by size and its per-generation caps on LL and LL128 (llMaxBws: ring LL "
               "at most 87.7 GB/s busbw on Ampere); NCCL before 2.21 priced ring LL at a quarter of the busbw, not "
               "a half, and the A100 sweep's NCCL version is not stated; trees")
_NVLS_OMITS = ("NVLS priced as (n+1)/n of the buffer each way at one fitted fraction of the link (0.686, H100), "
               "Simple protocol only; no channel ramp between 2 MiB and the plateau")


def _split(gpu: str, nbytes: int) -> str:
    """The rows a constant of :mod:`utils.parallel.comm.nccl_allreduce` was fitted on."""
    return "fit" if gpu == "H100-SXM" or (gpu == "A100-SXM4-80GB" and nbytes == 32 * KIB) else "holdout"


def allreduce_busbw_gb_per_s(gpu: str, n: int, nbytes: int, algorithm: str) -> float:
    """nccl-tests' all-reduce busbw (GB/s) of ``nbytes`` on ``n`` GPUs of one NVLink domain, as NCCL reaches it.

    ``algorithm`` is ``"ring"`` or ``"nvls"`` (NVLink SHARP); the time is
    :func:`~utils.parallel.comm.nccl_allreduce.nccl_allreduce_time` with its fitted defaults.
    """
    link = _hardware.spec(gpu).nvlink_bandwidth / 2
    seconds = _nccl.nccl_allreduce_time(n, nbytes, link, algorithm)
    return _bandwidth.allreduce_bus_bandwidth(_bandwidth.algorithm_bandwidth(nbytes, seconds), n) / 1e9


def _collective_entries() -> list[Entry]:
    rows = [("A100-SXM4-80GB", STAS_A100, nbytes, busbw, "ring") for nbytes, busbw in A100_BUSBW]
    rows += [("H200", STAS_H200, nbytes, busbw, algo) for nbytes, busbw, algo in H200_BUSBW]
    rows += [("H100-SXM", STAS_H100_FIT, nbytes, busbw, algo) for nbytes, busbw, algo in H100_FIT_BUSBW]
    out = []
    for gpu, source, nbytes, busbw, algorithm in rows:
        size = f"{nbytes // GIB} GiB" if nbytes >= GIB else f"{nbytes // MIB} MiB" if nbytes >= MIB else \
            f"{nbytes // KIB} KiB"
        out.append(Entry("collectives", f"all-reduce of {size} on 8 {gpu}, {'NVLS' if algorithm == 'nvls' else 'ring'}",
                         source, {"gpu": gpu, "n_gpus": 8, "nbytes": nbytes, "algorithm": algorithm,
                                  "latency_s": "nccl_allreduce.ALLREDUCE_BASE_LATENCY_S (fitted, 28.3 us) + the "
                                                "protocol's latency (NCCL's tuning model)"},
                         "all-reduce bus bandwidth (nccl-tests' busbw)", "GB/s", busbw,
                         partial(allreduce_busbw_gb_per_s, gpu, 8, nbytes, algorithm), _split(gpu, nbytes),
                         _NVLS_OMITS if algorithm == "nvls" else _RING_OMITS))
    return out


def _switches(gpu_ports: int) -> float:
    radix = int(_topology.PUBLISHED["quantum2_ports"].value)
    fabric = _topology.clos(gpu_ports, radix, _topology.min_tiers(gpu_ports, radix))
    return float(sum(fabric.switches_per_tier))


def _fat_tree_hosts() -> float:
    return float(_topology.fat_tree_max_hosts(48, 3))


def _topology_entries() -> list[Entry]:
    out = []
    for su, row in _topology.SUPERPOD_COMPUTE_FABRIC.items():
        out.append(Entry("network_topology", f"DGX SuperPOD compute fabric, {su} SU ({row['gpu_ports']:,} GPU ports)",
                         row["source"], {"gpu_ports": row["gpu_ports"], "radix": 64, "oversubscription": 1},
                         "switches (leaf + spine + core)", "switches", row["leaf"] + row["spine"] + row["core"],
                         partial(_switches, row["gpu_ports"]), "holdout",
                         "the reference architecture sizes its fabric by the same non-blocking Clos rule: exact "
                         "agreement checks the rule, not a measurement; cables, UFM and storage fabric left out"))
    fig = _topology.PUBLISHED["fat_tree_k48_hosts"]
    out.append(Entry("network_topology", "three-tier fat tree of 48-port switches", fig.source,
                     {"radix": 48, "tiers": 3}, "hosts", "hosts", fig.value, _fat_tree_hosts, "holdout",
                     "the paper's own closed form k^3/4: agreement checks the arithmetic"))
    return out


def entries() -> list[Entry]:
    """The all-reduce bus bandwidths and the fabric sizes."""
    return _collective_entries() + _topology_entries()
