"""The Python API against the C++ core and the CLI: presets, plans, per-rank views,
simulation, JSON round trip, validation, errors, lengths from lists / numpy / torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ballast
from plan_views import cli_plan_json, covered_tokens

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("BALLAST_BUILD_DIR", ROOT / "build"))
CLI = BUILD / "tools" / "ballast"

LENGTHS = [8192, 512, 300, 12000, 64, 1, 2049, 700]


def small_cluster(ranks_per_node=4, nodes=2):
    cluster = ballast.Cluster.load("h100", nodes=nodes)
    cluster.gpus_per_node = ranks_per_node
    cluster.nics_per_node = ranks_per_node
    return cluster


def test_listings_match_the_cli():
    assert "h100" in ballast.cluster_presets()
    assert "llama-7b" in ballast.model_presets()
    assert "analytical" in ballast.cost_models()
    names = ballast.strategies()
    assert names[:2] == ["packed-dp", "static-cp"] and "zeppelin" in names and "flexsp-fast" in names
    info = {row["name"]: row for row in ballast.strategy_info()}
    assert "remap" in info["zeppelin"]["parameters"]
    assert [name for name, _ in ballast.datasets()][:1] == ["wlbllm"]


@pytest.mark.parametrize("strategy", ["packed-dp", "static-cp", "static-cp-allgather", "static-ulysses",
                                      "batch-adaptive", "hybrid-dp", "flexsp-fast", "zeppelin",
                                      "zeppelin:remap=on", "zeppelin:partition=even:remap=on"])
def test_every_strategy_covers_every_token_once(strategy):
    plan = ballast.plan(LENGTHS, cluster=small_cluster(), model="llama3-8b", strategy=strategy)
    assert plan.ranks == 8 and plan.strategy == strategy.split(":")[0]
    want = sorted((s, p) for s, n in enumerate(LENGTHS) for p in range(n))
    assert covered_tokens(plan, "linear") == want
    assert covered_tokens(plan, "attention") == want
    assert ballast.validate(plan) == (True, "")
    for r in range(plan.ranks):
        for view in plan.rank(r).micro_batches:
            assert view.tokens == sum(piece.end - piece.begin for piece in view.linear)
            for group in view.groups:
                assert group.ranks[group.position] == r
                assert all(piece.group == group.index for piece in group.chunks)


def group_sizes(plan):
    return {len(group.ranks) for micro_batch in plan.micro_batches for group in micro_batch.groups}


@pytest.mark.parametrize("strategy", ["static-cp", "static-cp-allgather", "static-ulysses"])
def test_static_degree_is_fixed_by_the_runs_context(strategy):
    # 8 GPUs with room for about 4,096 tokens each: a 20,000-token context needs several.
    model = ballast.Model.load("llama-7b")
    cluster = ballast.Cluster.emulated(model, ranks=8, gpus_per_node=8, rank_tokens=4096)
    short = [512, 300, 64, 1]

    def planned(spec, **kwargs):
        return ballast.plan(short, cluster=cluster, model=model, strategy=spec, **kwargs)

    # Without a context the batch's longest sequence sets the degree: one GPU each here.
    assert group_sizes(planned(strategy)) == {1}
    # With the run's context, the degree that holds it, whatever the batch.
    fixed = group_sizes(planned(strategy, max_context_tokens=20000))
    assert len(fixed) == 1 and fixed != {1}
    assert group_sizes(planned(strategy + ":degree=per-step", max_context_tokens=20000)) == {1}
    with pytest.raises(ValueError, match="max_context_tokens"):
        planned(strategy, max_context_tokens=1 << 30)
    with pytest.raises(ValueError, match="max_context_tokens=0 must be at least 1"):
        planned(strategy, max_context_tokens=0)


def test_remapped_plan_views_match_the_transfers():
    plan = ballast.plan(LENGTHS, cluster=small_cluster(), model="llama3-8b",
                        strategy="zeppelin:partition=even:remap=on")
    views = [plan.rank(r).micro_batches for r in range(plan.ranks)]
    assert any(v.remapped for vs in views for v in vs)
    for m in range(plan.num_micro_batches):
        transfers = plan.remap_transfers(m)
        # Moving the linear layouts by the transfers gives every rank its attention layout.
        for dst in range(plan.ranks):
            received = [(t.sequence_id, p) for t in transfers if t.dst_rank == dst
                        for p in range(t.begin, t.end)]
            wanted = [(a.sequence_id, p) for a in views[dst][m].attention for p in range(a.begin, a.end)]
            assert received == wanted
        for r in range(plan.ranks):
            assert [(t.dst_rank, t.begin) for t in views[r][m].sends] == \
                [(t.dst_rank, t.begin) for t in transfers if t.src_rank == r != t.dst_rank]
            held = {(s.sequence_id, p) for s in views[r][m].linear for p in range(s.begin, s.end)}
            assert all((t.sequence_id, p) in held for t in transfers if t.src_rank == r
                       for p in range(t.begin, t.end))


def test_lengths_from_list_numpy_and_torch_give_the_same_plan():
    reference = ballast.plan(LENGTHS, nodes=1, strategy="flexsp-fast")
    assert ballast.plan(np.array(LENGTHS, dtype=np.int64), nodes=1, strategy="flexsp-fast") == reference
    assert ballast.plan(np.array(LENGTHS, dtype=np.int32), nodes=1, strategy="flexsp-fast") == reference
    assert ballast.plan(tuple(LENGTHS), nodes=1, strategy="flexsp-fast") == reference
    torch = pytest.importorskip("torch")
    tensor = torch.tensor(LENGTHS, dtype=torch.int64)
    assert ballast.plan(tensor, nodes=1, strategy="flexsp-fast") == reference
    # int64 arrays and CPU tensors are read in place (no Python-side copy).
    assert np.shares_memory(ballast._lengths_array(tensor), tensor.numpy())
    array = np.array(LENGTHS, dtype=np.int64)
    assert ballast._lengths_array(array) is array


def test_plan_matches_the_cli_byte_for_byte(tmp_path):
    if not CLI.exists():
        pytest.skip(f"{CLI} not built")
    cli = cli_plan_json(tmp_path, LENGTHS, "--cluster", "h100", "--nodes", "1", "--model", "llama-7b",
                        "--strategy", "zeppelin")
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy="zeppelin")
    assert plan.to_json() == cli
    # ... and the simulation equals `ballast simulate --format json`.
    plan_file = tmp_path / "plan.json"
    plan.save(plan_file)
    simulated = subprocess.run([str(CLI), "simulate", "--plan", str(plan_file), "--format", "json"],
                               capture_output=True, text=True, check=True).stdout
    [cli_step] = json.loads(simulated)["steps"]
    assert cli_step.pop("step") == 0
    assert cli_step == ballast.simulate(plan).to_dict()
    assert ballast.load_plans(plan_file) == [plan]


def test_json_round_trip_and_determinism():
    plan = ballast.plan(LENGTHS, cluster=small_cluster(), strategy="zeppelin:remap=on")
    text = plan.to_json()
    again = ballast.Plan.from_json(text)
    assert again == plan and again.to_json() == text
    assert ballast.plan(LENGTHS, cluster=small_cluster(), strategy="zeppelin:remap=on").to_json() == text
    assert json.loads(text)["strategy"] == "zeppelin"
    assert list(plan.lengths) == LENGTHS and plan.lengths.dtype == np.int64
    import pickle
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_simulate_report():
    plan = ballast.plan(LENGTHS, cluster=small_cluster(), strategy="hybrid-dp")
    report = ballast.simulate(plan)
    assert report.step_time_s >= report.lower_bound_s > 0
    assert len(report.ranks) == 8 and report.imbalance >= 1
    assert max(r.busy_s for r in report.ranks) <= report.step_time_s
    data = report.to_dict()
    assert data["strategy"] == "hybrid-dp" and data["step_time_s"] == report.step_time_s
    with pytest.raises(ValueError, match="trace=True"):
        report.chrome_trace()
    trace = json.loads(ballast.simulate(plan, trace=True).chrome_trace())
    assert trace["traceEvents"]
    assert "rank" in report.text(plan.cluster)
    # The gradient sync overlapped with the last backward pass (default) or all at the end.
    at_end = ballast.simulate(plan, grad_sync="end")
    assert 0 <= report.gradient_sync_exposed_s < at_end.gradient_sync_exposed_s
    assert at_end.gradient_sync_exposed_s == pytest.approx(at_end.gradient_sync_s)
    assert report.step_time_s < at_end.step_time_s
    with pytest.raises(ValueError, match="grad_sync 'later' is not a gradient sync mode"):
        ballast.simulate(plan, grad_sync="later")


def test_custom_cluster_and_model_from_dicts():
    cluster = ballast.Cluster.load("a800-roce").to_dict()
    cluster["nodes"] = 1
    model = ballast.Model.load("llama-7b").to_dict()
    model["layers"] = 4
    plan = ballast.plan([4000, 300], cluster=cluster, model=model, strategy="packed-dp")
    assert plan.cluster.nodes == 1 and plan.model.layers == 4
    assert ballast.Cluster.from_json(plan.cluster.to_json()) == plan.cluster


def test_validate_reports_a_broken_plan():
    plan = ballast.plan(LENGTHS, nodes=1, strategy="packed-dp")
    data = json.loads(plan.to_json())
    data["micro_batches"][0]["groups"][0]["sequences"][0]["chunks"][0][2] -= 1  # drop a token
    broken = ballast.Plan.from_json(json.dumps(data))
    ok, message = ballast.validate(broken)
    assert not ok and "sequence" in message
    with pytest.raises(ValueError, match="plan is invalid"):
        broken.check()
    with pytest.raises(ValueError, match="is invalid"):
        ballast.simulate(broken)


def test_errors_are_value_errors_with_the_cli_message():
    cases = [
        (dict(lengths=[5, 0]), "length 0"),
        (dict(lengths=[5, -3]), "positive"),
        (dict(lengths=[]), "empty"),
        (dict(lengths=[5], cluster="nope"), "unknown cluster 'nope'"),
        (dict(lengths=[5], model="nope"), "unknown model"),
        (dict(lengths=[5], strategy="nope"), "unknown strategy"),
        (dict(lengths=[5], strategy="zeppelin:remap=maybe"), "remap"),
        (dict(lengths=[5], cost_model="nope"), "cost model"),
        (dict(lengths=[[1, 2], [3, 4]]), "one-dimensional"),
        (dict(lengths=[1.5, 2]), "whole token counts"),
    ]
    for kwargs, fragment in cases:
        with pytest.raises(ValueError, match=fragment):
            ballast.plan(**kwargs)
    with pytest.raises(ballast.PlanningError, match="sequence 0"):
        ballast.plan([10**8], nodes=1)
    assert issubclass(ballast.PlanningError, ValueError)
    with pytest.raises(ValueError, match="rank 8"):
        ballast.plan([5], nodes=1).rank(8)
    with pytest.raises(ValueError, match="not valid JSON"):
        ballast.Plan.from_json("{", "plan.json")
    with pytest.raises(ValueError, match="plan.json"):
        ballast.Plan.from_json("{}", "plan.json")
    with pytest.raises(ValueError):
        ballast.load_plans("/nonexistent/plan.json")
    bad = small_cluster()
    bad.nodes = 0
    with pytest.raises(ValueError, match="nodes"):
        ballast.plan([5], cluster=bad)


def test_cli_and_python_print_the_same_error(tmp_path):
    if not CLI.exists():
        pytest.skip(f"{CLI} not built")
    cli = subprocess.run([str(CLI), "plan", "--strategy", "zeppelin", "--cluster", "nope"], capture_output=True, text=True)
    assert cli.returncode == 2
    with pytest.raises(ValueError) as error:
        ballast.plan([5], cluster="nope")
    assert cli.stderr.strip() == f"ballast: error: {error.value}"


def test_sample_batches_is_the_cli_sampler():
    first = ballast.sample_batches("wlbllm", tokens_per_step=65536, steps=2, seed=3)
    again = ballast.sample_batches("wlbllm", tokens_per_step=65536, steps=2, seed=3)
    assert len(first) == 2 and all((a == b).all() for a, b in zip(first, again))
    assert all(batch.sum() <= 65536 and batch.dtype == np.int64 for batch in first)
    [fixed] = ballast.sample_batches("prolong", batch_size=17)
    assert len(fixed) == 17
    with pytest.raises(ValueError, match="unknown dataset|not a file|known"):
        ballast.sample_batches("nope")


def test_help_shows_an_example():
    assert "Example" in ballast.plan.__doc__ and ">>> p = ballast.plan(" in ballast.plan.__doc__
    assert ballast.plan.__annotations__["return"] in ("Plan", ballast.Plan)


def test_import_does_not_import_torch():
    code = "import sys, ballast; assert 'torch' not in sys.modules, 'ballast imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())


def test_emulated_cluster_shape_and_memory():
    """The gloo processes' cluster: `ballast run` plans on the same shape and memory with
    the host's measured constants (`ballast calibrate --host`)."""
    model = ballast.Model.load("llama-7b")
    cluster = ballast.Cluster.emulated(model, ranks=8, gpus_per_node=4, rank_tokens=4096)
    assert (cluster.nodes, cluster.gpus_per_node, cluster.nics_per_node) == (2, 4, 4)
    assert cluster.peak_flops_per_s == 28e9  # the fixed estimate (src/cost/emulated_cluster.cpp)
    # Memory: the ZeRO-3 share of the model states (16 bytes per parameter) plus 4,096
    # tokens of activations, 90% usable.
    usable = cluster.gpu_memory_bytes * cluster.memory_usable_fraction
    expected = 16.0 * model.parameters / 8 + model.activation_bytes_per_token * 4096
    assert abs(usable - expected) <= 1.0
    with pytest.raises(ValueError, match="gpus_per_node"):
        ballast.Cluster.emulated(model, ranks=8, gpus_per_node=3, rank_tokens=4096)
    # The model as plan() takes it: a preset name (or file, dict), not only a Model.
    assert ballast.Cluster.emulated("llama-7b", 8, 4, 4096) == cluster
    assert ballast.Cluster.emulated(model.to_dict(), 8, 4, 4096) == cluster


def test_model_recompute_sets_memory_and_cost():
    """Full recomputation keeps each layer's input and reruns the forward: more tokens fit
    per GPU and the same plan takes longer (docs/cost-model.md)."""
    selective = ballast.Model.load("llama-7b")
    assert selective.recompute == "selective"
    full = ballast.Model.load("llama-7b")
    full.recompute = "full"
    import json

    assert json.loads(full.to_json())["recompute"] == "full"
    assert ballast.Model.from_json(full.to_json()).recompute == "full"
    lengths = [12288, 8192, 4096, 2048, 1024]
    before = ballast.simulate(ballast.plan(lengths, cluster="h100", nodes=1, model=selective,
                                           strategy="packed-dp"))
    after = ballast.simulate(ballast.plan(lengths, cluster="h100", nodes=1, model=full,
                                          strategy="packed-dp"))
    assert after.step_time_s > before.step_time_s
    assert after.peak_memory_bytes < before.peak_memory_bytes
    with pytest.raises(ValueError, match="Model.recompute 'partial'"):
        full.recompute = "partial"


def test_version_is_the_projects_everywhere(tmp_path):
    """ballast.__version__, `ballast --version` and a plan file's ballast_version are all
    project(VERSION) of CMakeLists.txt."""
    import re
    root = Path(__file__).resolve().parents[2]
    expected = re.search(r"project\(ballast VERSION ([0-9.]+)",
                         (root / "CMakeLists.txt").read_text()).group(1)
    assert ballast.__version__ == expected
    plan = ballast.plan([4096, 1024], cluster="h100", nodes=1, strategy="hybrid-dp")
    plan.save(tmp_path / "plan.json")
    assert json.loads((tmp_path / "plan.json").read_text())["ballast_version"] == expected



def test_flexsp_milp_plan_is_the_same_whatever_the_blas_threads():
    # The MILP's LAPACK is OpenBLAS's (Debian); the module pins it to one thread while CBC
    # solves (src/strategies/flexsp_milp.cpp), also where the module is loaded RTLD_LOCAL
    # and does not link OpenBLAS itself (the pip install). These 6 lengths planned other
    # ranks with 4 threads than with 1 before the pin (FlexSpMilp.SamePlanWhateverTheBlasThreads).
    import ctypes
    try:  # the OpenBLAS the process already has; none loaded means no OpenBLAS LAPACK
        openblas = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        pytest.skip("no OpenBLAS loaded: the LAPACK is another")
    lengths = [37027, 38740, 44755, 30658, 21807, 82886]
    before = openblas.openblas_get_num_threads()
    try:
        openblas.openblas_set_num_threads(4)
        threaded = ballast.plan(lengths, cluster="a100-ib400", nodes=8, model="llama-7b", strategy="flexsp")
        assert openblas.openblas_get_num_threads() == 4  # restored after the solve
        openblas.openblas_set_num_threads(1)
        single = ballast.plan(lengths, cluster="a100-ib400", nodes=8, model="llama-7b", strategy="flexsp")
    finally:
        openblas.openblas_set_num_threads(before)
    assert threaded.to_json() == single.to_json()
