"""Messages raised from the Python API name the Python argument that fixes them
(``max_context_tokens``, ``nodes``, the strategy parameter ``degree``), never a CLI flag
such as ``--max-context``: the C++ library words a setting for the frontend that loaded
it (``ballast::setting_name``, set to Python when the module is imported)."""

import re

import numpy as np
import pytest

import ballast

CLI_FLAG = re.compile(r"--[a-z]")


def planned(lengths, **kwargs):
    return lambda: ballast.plan(lengths, **kwargs)


def sampled(**kwargs):
    return lambda: ballast.sample_batches(**kwargs)


# (what, call, error class, Python names the message must contain)
CASES = [
    ("packed-dp cannot hold a sequence", planned([10**7], nodes=1, strategy="packed-dp"),
     ballast.PlanningError, ["give shorter lengths (plan() plans every length it is given"]),
    ("zeppelin cannot hold a sequence", planned([10**8], nodes=1, strategy="zeppelin"),
     ballast.PlanningError, ["give shorter lengths", "or add nodes"]),
    ("hybrid-dp cannot hold a sequence", planned([10**8], nodes=1, strategy="hybrid-dp"),
     ballast.PlanningError, ["give shorter lengths", "or add nodes"]),
    ("static-ulysses cannot hold a sequence", planned([10**8], nodes=1, strategy="static-ulysses"),
     ballast.PlanningError, ["give shorter lengths", "or add nodes"]),
    ("the run's context too long for static-cp", planned([4096], nodes=1, strategy="static-cp",
                                                         max_context_tokens=10**8),
     ValueError, ["lower max_context_tokens or add nodes"]),
    ("a degree that does not divide the ranks", planned([4096], nodes=1, strategy="static-cp:degree=3"),
     ValueError, ["strategy parameter degree 3 is not valid"]),
    ("a degree too small for a sequence", planned([20000], nodes=1, strategy="static-cp:degree=1"),
     ballast.PlanningError, ["at strategy parameter degree 1", "use strategy parameter degree 2"]),
    ("zeppelin's degree without partition=even", planned([4096], nodes=1, strategy="zeppelin:degree=2"),
     ValueError, ["drop strategy parameter degree"]),
    ("more sequences than a batch holds", planned(np.ones(1_000_001, dtype=np.int64), nodes=1),
     ValueError, ["lower batch_size or tokens_per_step"]),
    ("a model that does not fit", planned([4096], cluster="a100-ib400", model="gpt-30b", nodes=1),
     ValueError, ["(nodes)"]),
    ("a profiled cost model for another model", planned([4096], cost_model="flexsp-a100-192k", model="llama-7b"),
     ValueError, ["use cost_model analytical"]),
    ("max_context_tokens 0", sampled(max_context_tokens=0), ValueError, ["max_context_tokens must be positive"]),
    ("neither budget", sampled(tokens_per_step=None), ValueError, ["tokens_per_step and batch_size"]),
    ("tokens_per_step 0", sampled(tokens_per_step=0), ValueError, ["tokens_per_step must be positive"]),
    ("steps 0", sampled(steps=0), ValueError, ["steps 0 must be at least 1"]),
    ("steps over the limit", sampled(steps=10**8), ValueError,
     ["steps 100000000 is over ballast's limit of 10,000", "another run with a different seed"]),
    ("every document over the context", sampled(dataset="prolong", max_context_tokens=100, over_context="drop"),
     ValueError, ["longer than max_context_tokens 100", "raise max_context_tokens or pass over_context split"]),
    ("most documents over the context", sampled(max_context_tokens=1, tokens_per_step=65536, over_context="drop"), ValueError,
     ["longer than max_context_tokens 1; raise it"]),
    ("the error over-context policy", sampled(max_context_tokens=1024, over_context="error"), ValueError,
     ["more than max_context_tokens 1024", "pass over_context split"]),
    ("a budget below the shortest document", sampled(tokens_per_step=1, max_context_tokens=1 << 20, dataset="prolong"),
     ValueError, ["tokens_per_step 1 is smaller", "raise tokens_per_step"]),
    ("a histogram in sequential order", sampled(dataset="magi", order="sequential"), ValueError,
     ["use order random"]),
    ("nodes 0", lambda: ballast.Cluster.load("h100", nodes=0), ValueError, ["nodes must be >= 1"]),
    ("too many nodes", lambda: ballast.Cluster.load("h100", nodes=10**5), ValueError, ["use nodes 8192 or fewer"]),
    ("an emulated node size that does not divide", lambda: ballast.Cluster.emulated(
        ballast.Model.load("llama-7b"), ranks=8, gpus_per_node=3, rank_tokens=4096), ValueError,
     ["gpus_per_node 3 does not divide"]),
]


@pytest.mark.parametrize("what, call, error, names", CASES, ids=[case[0] for case in CASES])
def test_errors_name_the_python_argument(what, call, error, names):
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for name in names:
        assert name in message, f"{what}: {name!r} not in {message!r}"
    assert not CLI_FLAG.search(message), f"{what}: a CLI flag in {message!r}"


def test_report_text_points_to_python_not_to_format_flags():
    cluster = ballast.Cluster.load("h100", nodes=1)
    text = ballast.simulate(ballast.plan([4096, 512], cluster=cluster)).text(cluster)
    assert "all ranks: report.ranks or report.to_json()" in text
    assert not CLI_FLAG.search(text), text
