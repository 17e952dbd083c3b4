import pytest
from patterns_factory import make_doc

from eroica.collector.privacy import Privacy, agree_salt, level_from
from eroica.collector.sync import LocalStore
from eroica.schema.patterns import ConfigFact


def test_one_salt_per_job_so_peers_still_compare() -> None:
    store = LocalStore()
    a, b = agree_salt(store), agree_salt(store)
    assert a == b and len(a) == 32
    docs = [make_doc(r, busy={"region:log_metrics": 0.01, "compute:aten::mm": 0.02}) for r in range(2)]
    nodes = {"AddmmBackward0": 20, "torch::autograd::AccumulateGrad": 8, "AliceGateBackward": 10}
    docs = [d.model_copy(update={"config": [ConfigFact(key="data.dir", value="/home/alice/shards/x.py")],
                                 "autograd_nodes_total": nodes}) for d in docs]
    h0, h1 = (Privacy("hash", a).apply(d) for d in docs)
    names0 = {f.name for f in h0.functions}
    assert names0 == {f.name for f in h1.functions}                      # same names on every rank
    assert "log_metrics" not in str(names0) and "aten::mm" in names0     # framework ops are kept
    assert h0.job.hostname.startswith("host-") and h0.privacy == "hash"
    assert "/home/alice" not in h0.config[0].value
    # a light window's node counts: the framework's kept, a user's autograd.Function hashed like its code
    assert h0.autograd_nodes_total == h1.autograd_nodes_total
    assert {"AddmmBackward0", "torch::autograd::AccumulateGrad"} < set(h0.autograd_nodes_total)
    assert "AliceGateBackward" not in h0.autograd_nodes_total
    assert sorted(h0.autograd_nodes_total.values()) == [8, 10, 20]
    d = Privacy("drop", a).apply(docs[0])
    assert d.job.hostname == "-" and d.config == [] and d.privacy == "drop"
    assert Privacy("keep", "").apply(docs[0]) is docs[0]
    assert Privacy("hash", "other").apply(docs[0]).functions != h0.functions   # another job, other hashes


def test_an_unknown_level_is_a_clear_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EROICA_PRIVACY", "secret")
    with pytest.raises(ValueError, match="use one of keep, hash, drop"):
        level_from(None)
