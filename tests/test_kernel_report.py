"""tools/kernel_report.py: ptxas's register and spill report through NVRTC (in the test extra), and
the main-loop count of SASS text. The flash-attention kernels' register budget is asserted here,
since its speed cannot be timed without a GPU: no kernel spills more than a few words at the head
sizes' default forward shape, dq fits 3 blocks per multiprocessor up to head size 64, two
forward m-tiles per warp spill from head size 80 (why forward_m_tiles keeps one there), and the
fused backward does not spill where it exists (up to head size 80)."""
import os
import sys

import pytest

from engine.kernels import flash_attention as fa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
    import kernel_report
finally:
    sys.path.pop(0)

FEW_WORDS = 32  # bytes of spill stores tolerated: a few values kept across the main loop, not in it


@pytest.fixture(scope="module")
def nvrtc():
    from nvrtc_helper import nvrtc_compiler
    nvrtc_compiler()  # skips with the reason when NVRTC or the CUDA headers are missing


@pytest.mark.parametrize("d", fa.HEAD_SIZES)
def test_flash_kernels_fit_their_register_budget(nvrtc, d):
    report = kernel_report.registers(fa.source(d))
    assert set(report) == {fa.forward_name(d)} | {f"flash_{k}__hd{d}" for k in fa.backward_kernels(d)}
    for name, r in report.items():
        assert r["registers"] <= 255, (name, r)
        if d <= 80 or "dkdv" not in name:  # dkdv from head size 96: a known limit (docs/cuda.md)
            # (and the fused backward, whose tiles fit in shared memory up to head size 80)
            assert r["spill_stores"] <= FEW_WORDS, (name, r)
    if d <= 64:
        assert report[f"flash_dq__hd{d}"]["warps_per_sm"] >= 12, report  # __launch_bounds__(128, 3)
        assert fa.forward_m_tiles(d) == 2
    else:
        assert fa.forward_m_tiles(d) == 1
        two = kernel_report.registers(fa.source(d, 2))[fa.forward_name(d, 2)]
        assert two["spill_stores"] > FEW_WORDS, two  # the reason the larger heads keep one m-tile


SASS = """
        Function : k
        .headerflags    @"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   MOV R2, RZ ;
        /*0020*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   BRA 0x50 ;
        /*0060*/                   EXIT ;
        Function : straight
        /*0000*/                   EXIT ;
"""


def test_main_loop_is_the_longest_backward_branch():
    loops = kernel_report.main_loops(SASS)
    assert set(loops) == {"k"}  # the kernel without a backward branch has no loop
    n, ops = loops["k"]
    assert n == 3 and ops == {"HMMA": 1, "MUFU": 1, "BRA": 1}  # 0x20..0x40; the self-branch at 0x50 is shorter


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit, match="not MODULE:EXPRESSION"):
        kernel_report.load_source("engine.kernels.layer_norm")
    with pytest.raises(SystemExit, match="matches nothing"):
        kernel_report.substitute("int x;", ["float=>double"])
    with pytest.raises(SystemExit, match="not a CUDA source string"):
        kernel_report.load_source("engine.kernels.flash_attention:ROWS")


# The steady state of the kernels' loops: tiles without element checks, no dropout
STEADY = ["const bool edge = edge_tile\\([^;]*\\);=>const bool edge = false;", "dr\\.factor\\(kb, nt, e\\)=>1.f",
          "const unsigned kb = dr\\.bits\\([^;]*\\);=>"]


def test_steady_loops_when_the_tools_are_installed(nvrtc):
    """The forward's loop: 128 products per 64 keys and warp, each ldmatrix'd K and V fragment
    shared by the two m-tiles (32 ldmatrix); no kernel's steady loop touches local memory."""
    try:
        loops = kernel_report.main_loops(kernel_report.sass(kernel_report.substitute(fa.source(64), STEADY)))
    except SystemExit as e:
        pytest.skip(str(e))  # ptxas / cuobjdump / nvdisasm: not in the test extra
    ops = loops[fa.forward_name(64)][1]
    assert ops["HMMA"] == 128 and ops["LDSM"] == 32, ops
    # 3 and 4 products of 16 x 64 x 64 per warp and step; the fused backward 5 (dq's with dkdv's)
    assert [loops[f"flash_{k}__hd64"][1]["HMMA"] for k in ("dq", "dkdv", "bwd")] == [96, 128, 160]
    assert loops["flash_bwd__hd64"][1]["REDG"] == 32  # dq's atomics: reductions that return nothing
    for name, (n, ops) in loops.items():
        assert ops["LDL"] == 0 and ops["STL"] == 0, (name, ops)
