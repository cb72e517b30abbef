"""Planning with tensor parallelism from Python: ballast.plan(..., tensor_parallel=N) plans on
TP groups of N GPUs (the CLI's --tp), the plan keeps its cluster of TP groups through JSON,
pickling, plan files and per-rank views, and bad degrees name the valid ones."""

import json
import pickle

import pytest

import ballast
from plan_views import CLI, cli_plan_json, covered_tokens

LENGTHS = [8192, 512, 300, 12000, 64, 1, 2049, 700]


@pytest.mark.parametrize("strategy", ["packed-dp", "static-cp", "static-ulysses", "flexsp-fast", "zeppelin",
                                      "zeppelin:remap=on", "hybrid-dp"])
def test_plan_ranks_are_tp_groups(strategy):
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy=strategy, tensor_parallel=2)
    assert (plan.ranks, plan.gpus, plan.tensor_parallel) == (4, 8, 2)
    assert (plan.cluster.ranks, plan.cluster.gpus, plan.cluster.tensor_parallel) == (4, 8, 2)
    assert plan.cluster.gpus_per_node == 4  # TP groups per node
    assert ballast.validate(plan) == (True, "")
    want = sorted((s, p) for s, n in enumerate(LENGTHS) for p in range(n))
    assert covered_tokens(plan, "linear") == want
    assert covered_tokens(plan, "attention") == want
    for group in (g for mb in plan.micro_batches for g in mb.groups):
        assert all(0 <= r < 4 for r in group.ranks)
    with pytest.raises(ValueError, match=r"rank 4 is not in the plan's cluster of 4 ranks"):
        plan.rank(4)


def test_tensor_parallel_one_is_the_plan_without_tp():
    plain = ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy="zeppelin")
    assert ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy="zeppelin",
                        tensor_parallel=1) == plain
    assert (plain.ranks, plain.gpus, plain.tensor_parallel, plain.cluster.tensor_parallel) == (8, 8, 1, 1)
    assert "tensor_parallel" not in json.loads(plain.to_json())["cluster"]


def test_simulate_prices_the_tp_collectives():
    plain = ballast.simulate(ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b",
                                          strategy="packed-dp"))
    report = ballast.simulate(ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b",
                                           strategy="packed-dp", tensor_parallel=2), trace=True)
    assert len(report.ranks) == 4
    assert report.step_time_s >= report.lower_bound_s > 0
    assert report.step_time_s != plain.step_time_s
    trace = json.loads(report.chrome_trace())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert any("TP group" in name for name in names), names
    assert "tensor parallel" in report.chrome_trace()


def test_json_pickle_and_files_keep_the_tp_cluster(tmp_path):
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=2, model="llama-7b", strategy="zeppelin",
                        tensor_parallel=4, step=3)
    text = plan.to_json()
    assert json.loads(text)["cluster"]["tensor_parallel"]["gpus"] == 4
    again = ballast.Plan.from_json(text)
    assert again == plan and again.tensor_parallel == 4 and again.ranks == 4
    assert pickle.loads(pickle.dumps(plan)) == plan
    path = tmp_path / "plan.json"
    plan.save(path)
    [loaded] = ballast.load_plans(path)
    assert loaded == plan and loaded.step == 3
    assert [len(v.micro_batches) for v in (loaded.rank(r) for r in range(loaded.ranks))] == \
        [plan.num_micro_batches] * 4
    assert ballast.simulate(loaded).step_time_s == ballast.simulate(plan).step_time_s


def test_a_plans_cluster_plans_as_it_is():
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy="flexsp-fast",
                        tensor_parallel=2)
    for tensor_parallel in (1, 2):
        again = ballast.plan(LENGTHS, cluster=plan.cluster, model=plan.model, strategy="flexsp-fast",
                             tensor_parallel=tensor_parallel)
        assert again == plan
    with pytest.raises(ValueError, match=r"already is a cluster of TP groups of 2 GPUs.*tensor_parallel=1 or 2"):
        ballast.plan(LENGTHS, cluster=plan.cluster, model=plan.model, tensor_parallel=4)
    assert ballast.tensor_parallel_units(plan.cluster, plan.model, 2) == plan.cluster


def test_tensor_parallel_units_and_degrees():
    units = ballast.tensor_parallel_units("h100", "llama-7b", 4, nodes=2)
    assert (units.nodes, units.gpus_per_node, units.ranks, units.gpus, units.tensor_parallel) == (2, 2, 4, 16, 4)
    gpu = ballast.Cluster.load("h100")
    assert units.peak_flops_per_s == pytest.approx(4 * gpu.peak_flops_per_s)
    assert "tensor_parallel=4" in repr(units)
    assert ballast.tensor_parallel_degrees("h100", "llama-7b") == [1, 2, 4, 8]
    model = ballast.Model.load("llama-7b")
    model.kv_heads = 2
    assert ballast.tensor_parallel_degrees("h100", model) == [1, 2]


@pytest.mark.parametrize("degree, why", [(3, "8 GPUs per node"), (16, "8 GPUs per node"), (0, "valid values"),
                                         (-2, "valid values")])
def test_bad_degrees_name_the_valid_values(degree, why):
    with pytest.raises(ValueError, match=r"tensor_parallel .* is not valid .*valid values: 1, 2, 4, 8") as error:
        ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", tensor_parallel=degree)
    assert why in str(error.value)
    assert "--tp" not in str(error.value)


def test_a_degree_the_kv_heads_refuse():
    model = ballast.Model.load("llama-7b")
    model.kv_heads = 2
    with pytest.raises(ValueError, match=r"tensor_parallel 4 is not valid .* 2 KV heads.*valid values: 1, 2$"):
        ballast.plan(LENGTHS, cluster="h100", nodes=1, model=model, tensor_parallel=4)


def test_ulysses_degree_times_tp_must_divide_the_kv_heads():
    model = ballast.Model.load("llama-7b")
    model.kv_heads = 4
    with pytest.raises(ValueError, match=r"tensor_parallel 2"):
        ballast.plan(LENGTHS, cluster="h100", nodes=1, model=model, strategy="static-ulysses:degree=4",
                     tensor_parallel=2)
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=1, model=model, strategy="static-ulysses:degree=2",
                        tensor_parallel=2)
    assert {len(g.ranks) for mb in plan.micro_batches for g in mb.groups if g.scheme == "ulysses"} == {2}


def test_plan_matches_the_cli_with_tp(tmp_path):
    if not CLI.exists():
        pytest.skip(f"{CLI} not built")
    cli = cli_plan_json(tmp_path, LENGTHS, "--cluster", "h100", "--nodes", "1", "--model", "llama-7b",
                        "--strategy", "zeppelin", "--tp", "2")
    plan = ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", strategy="zeppelin",
                        tensor_parallel=2)
    assert plan.to_json() == cli


def test_a_profiled_cost_model_cannot_price_tp_groups():
    with pytest.raises(ValueError, match=r"tensor_parallel 2: profiled cost model .* use cost_model analytical "
                                         r"or drop tensor_parallel"):
        ballast.plan(LENGTHS, cluster="h100", nodes=1, model="llama-7b", cost_model="flexsp-a100-192k",
                     tensor_parallel=2)
