"""`omnialign bench staging --tiny`: the staging bench runs its FlowGRPO update on a tiny Qwen-Image transformer (it
broke silently once when the objective it called moved)."""

from omnialign.bench.staging import bench_staging


def test_bench_staging_tiny_rows():
    rows = bench_staging([2], ["on"], tiny=True, micro=4)
    assert [(r["window"], r["staging"]) for r in rows] == [(2, "on")]
    assert all(r["update_s"] > 0 and r["s_per_step"] > 0 for r in rows)
