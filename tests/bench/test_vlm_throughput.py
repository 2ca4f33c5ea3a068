"""bench/vlm_throughput.py at the example's tiny shape: it runs, every request carries images, and it reports
each of ViSpec stage 2's requests and DSpark-VLM's."""

import json

from .bench_support import run_bench


def test_the_vlm_bench_runs_and_reports_stage_2s_requests(tmp_path):
    out = tmp_path / "vlm.json"
    run_bench("vlm_throughput.py", "--small", "--repeats", "1", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["cpu_shape"]["image_tokens"] == 2 * 2 * 16  # two rows of two 112x112 images
    assert set(result["through_one_server"]) == {"vispec", "vispec compact", "dspark_vlm"}
    assert all(row["bare_s"] > 0 and row["server_s"] > 0 for row in result["through_one_server"].values())
