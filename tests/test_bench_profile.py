"""`bench --profile`: kernel names sorted into kinds, the summary's arithmetic, and a real profiled step on the CPU."""

import gzip
import json

import pytest
import torch

from omnialign.bench.profile import by_phase, kind, profiled, summarise


@pytest.mark.parametrize(("name", "expected"), [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "matmul"),
    ("aten::addmm", "matmul"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, cutlass::bfloat16_t>>",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("triton_poi_fused__to_copy_add_mul_0", "triton"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
     "reduce"),
    ("Memcpy DtoD (Device -> Device)", "copy/cast"),
    ("aten::copy_", "copy/cast"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
     "copy/cast"),
    ("void at::native::elementwise_kernel<128, 2, at::native::BinaryFunctor<float, float, float, broadcast>>",
     "elementwise"),
    ("ncclDevKernel_AllGather_RING_LL", "other"),
])  # fmt: skip
def test_kernel_kinds(name, expected):
    assert kind(name) == expected


def test_summary_adds_up_by_kind():
    events = [("aten::mm", 6.0), ("aten::mm", 2.0), ("flash_fwd", 1.0), ("aten::add", 0.5), ("nccl", 0.5)]
    s = summarise(events, wall_ms=20.0)
    assert s["device_ms"] == 10.0 and s["busy_share"] == 0.5
    assert list(s["kinds"]) == ["matmul", "attention", "elementwise", "other"]  # costliest first
    assert s["kinds"]["matmul"] == {"ms": 8.0, "share": 0.8}
    assert s["top"][0] == {"name": "aten::mm", "kind": "matmul", "ms": 8.0}


def test_phases_count_the_events_that_start_inside_them():
    events = [("aten::mm", 0.0, 3.0), ("aten::add", 5_000.0, 1.0), ("aten::mm", 12_000.0, 2.0), ("nccl", 30_000.0, 9.0)]
    phases = [("update", 10_000.0, 20_000.0), ("rollout", 0.0, 8_000.0), ("update", 25_000.0, 26_000.0)]
    s = by_phase(events, phases)
    assert list(s) == ["rollout", "update"]  # the order they ran; the event outside every range is in neither
    assert s["rollout"] == {
        "wall_ms": 8.0,
        "device_ms": 4.0,
        "busy_share": 0.5,
        "kinds": {"matmul": {"ms": 3.0, "share": 0.75}, "elementwise": {"ms": 1.0, "share": 0.25}},
    }
    assert s["update"]["wall_ms"] == 11.0 and s["update"]["device_ms"] == 2.0  # its two ranges summed


def test_profiled_step_writes_a_trace_and_its_kinds(tmp_path):
    cuda = torch.cuda.is_available()
    a = torch.randn(1024, 1024, device="cuda" if cuda else "cpu")  # kernels where they run

    def step():
        with torch.profiler.record_function("phase/rollout"):
            b = a + 1
        with torch.profiler.record_function("phase/update"):
            return sum((b @ a).sum() for _ in range(10))

    result, summary = profiled(step, tmp_path, cuda)
    assert torch.isfinite(result)
    assert summary["kinds"]["matmul"]["share"] > 0.5  # the step is matmuls
    assert all(not t["name"].startswith("phase/") for t in summary["top"])
    phases = summary["phases"]
    assert list(phases) == ["rollout", "update"] and "matmul" not in phases["rollout"]["kinds"]
    assert phases["update"]["kinds"]["matmul"]["share"] > 0.5 and 0 < phases["update"]["busy_share"] <= 1
    assert sum(p["device_ms"] for p in phases.values()) <= summary["device_ms"] + 0.1
    assert json.loads((tmp_path / "kernels.json").read_text()) == summary
    trace = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    assert any(e.get("name") == "phase/update" for e in trace["traceEvents"])
