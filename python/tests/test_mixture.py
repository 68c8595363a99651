"""shardkit.Loader over a mixture of datasets (a list of (address, weight) entries or dicts).

The three sources are of different formats (tar shards, LMDB, MDS, each made by
shardkit.convert from its own image folder) with disjoint keys and class names, so a
row's key says which dataset it came from: per-source counts per epoch are the shares
computed by hand from the documented rule, labels carry each entry's label_offset,
return_sources names the dataset each row came from, and the order is a function of the
seed and the sources only.
"""
import collections
import math

import pytest

import shardkit

from conftest import make_mixture_sources

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not shardkit.HAVE_LOADER, reason="no loader in this build")

SIZES = (12, 10, 8)
OFFSETS = (0, 3, 5)  # a: labels 0-2, b: 3-4, c: 5-6


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """[(address, {key: label in its own dataset})] for tar shards, LMDB and MDS."""
    parts = make_mixture_sources(str(tmp_path_factory.mktemp("mix")))
    assert tuple(len(keys) for _, keys in parts) == SIZES
    return parts


def make(source, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("output_size", 8)
    kw.setdefault("dtype", "uint8")
    kw.setdefault("threads", 1)
    kw.setdefault("seed", 3)
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return shardkit.Loader(source, **kw)


def rows(ld):
    """Every row of one epoch: (key, label, source, item)."""
    out = []
    while True:
        b = ld._loader.next()
        if b is None:
            return out
        srcs = torch.from_dlpack(b.sources()).tolist()
        labels = torch.from_dlpack(b.labels()).tolist()
        out += list(zip(b.keys, labels, srcs, b.indices))
        b.drop()


# Each case: entries (built from the three addresses) and the per-epoch counts the rule
# gives, worked out by hand.
CASES = {
    # Weights only: the total 30 shared 1:1:2 = 7.5, 7.5, 15; the one sample left by the
    # floors goes to the largest remainder, the tie to the lower index: 8, 7, 15.
    "weights": (lambda a, b, c: [(a, 1), (b, 1.0), (c, 2)], (8, 7, 15)),
    # repeat 0.5 of 12 = 6; choose 3 of 10; c alone is weighted: its own 8.
    "repeat-choose": (lambda a, b, c: [{"address": a, "repeat": 0.5}, {"address": b, "choose": 3},
                                       {"address": c, "weight": 5}], (6, 3, 8)),
    # More than a pass: choose 20 of 12 (a pass and 8 of a second), repeat 1.25 of 10 =
    # 12.5, rounded half to even: 12; c by weight: 8.
    "passes": (lambda a, b, c: [{"address": a, "choose": 20}, {"address": b, "repeat": 1.25}, c], (20, 12, 8)),
    # A weight of 0 gives nothing and its size adds nothing to the total shared: 12 + 8
    # shared 3:0:1 = 15, 0, 5.
    "zero-weight": (lambda a, b, c: [(a, 3), (b, 0), (c, 1)], (15, 0, 5)),
    # The weighted entries share their own total (12 + 8), whatever b's repeat takes.
    "mixed": (lambda a, b, c: [(a, 3), {"address": b, "repeat": 2}, c], (15, 20, 5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_source_counts_are_the_computed_shares(mix, case):
    build, want = CASES[case]
    addresses = [a for a, _ in mix]
    ld = make(build(*addresses))
    assert [s["per_epoch"] for s in ld.sources] == list(want)
    assert [s["samples"] for s in ld.sources] == list(SIZES)
    assert ld.epoch_size == sum(want)
    assert ld.num_samples == sum(SIZES)
    assert len(ld) == math.ceil(sum(want) / 4)
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        got = rows(ld)
        assert len(got) == sum(want)
        assert collections.Counter(s for _, _, s, _ in got) == {i: m for i, m in enumerate(want) if m}
        # Items are distinct (a source's passes are distinct items); within a source, a
        # sample appears floor(m/n) or ceil(m/n) times: each pass is a permutation.
        assert len(set(item for *_, item in got)) == len(got)
        for i, ((_, keys), m) in enumerate(zip(mix, want)):
            per_key = collections.Counter(k for k, _, s, _ in got if s == i)
            assert set(per_key) <= set(keys)
            full, part = divmod(m, len(keys))
            assert sorted(per_key.values()) == sorted([full] * (len(keys) - part) + [full + 1] * part
                                                      if full else [1] * part)


def test_sources_are_interleaved_in_proportion(mix):
    # "Ideal time": every prefix of the order holds each source's share to within the
    # number of sources.
    addresses = [a for a, _ in mix]
    want = (8, 7, 15)
    got = [s for _, _, s, _ in rows(make(CASES["weights"][0](*addresses)))]
    seen = [0, 0, 0]
    for t, s in enumerate(got, 1):
        seen[s] += 1
        for i in range(3):
            assert abs(seen[i] - t * want[i] / 30) <= 3, (t, seen)


def test_labels_carry_label_offset(mix):
    entries = [{"address": a, "label_offset": off} for (a, _), off in zip(mix, OFFSETS)]
    got = rows(make(entries))
    assert len(got) == sum(SIZES)  # equal default weights: 30 shared 10, 10, 10
    for key, label, src, _ in got:
        assert label == OFFSETS[src] + mix[src][1][key], (key, src)
    assert sorted(set(label for _, label, _, _ in got)) == list(range(7))
    # Without offsets the datasets' labels overlap.
    plain = rows(make([a for a, _ in mix]))
    assert all(label == mix[src][1][key] for key, label, src, _ in plain)


def test_return_sources_names_the_dataset_of_each_row(mix):
    addresses = [a for a, _ in mix]
    ld = make([(addresses[0], 2), {"address": addresses[1], "repeat": 2}, addresses[2]],
              return_keys=True, return_sources=True, fields=("cls",))
    counts = collections.Counter()
    n = 0
    for images, labels, cls, keys, sources in ld:  # (images, labels, *fields, keys, sources)
        assert sources.dtype == torch.int64 and tuple(sources.shape) == (images.shape[0],)
        assert len(keys) == len(cls) == images.shape[0]
        for key, c, s in zip(keys, cls, sources.tolist()):
            assert key in mix[s][1], f"row {key!r} said to come from source {s}"
            assert c == mix[s][1][key]
            counts[s] += 1
        n += 1
    assert n == len(ld)
    assert [counts[i] for i in range(3)] == [s["per_epoch"] for s in ld.sources]
    # Without return_keys: (images, labels, sources).
    images, labels, sources = next(iter(make(addresses, return_sources=True)))
    assert sources.shape == labels.shape
    # One dataset: every row's source is 0.
    one = make(addresses[1], return_sources=True, return_keys=True)
    assert one.sources == [] and one.epoch_size == 10
    for _, _, keys, sources in one:
        assert sources.tolist() == [0] * len(keys)


def test_same_seed_same_order(mix):
    addresses = [a for a, _ in mix]
    entries = [(addresses[0], 1), {"address": addresses[1], "choose": 6}, (addresses[2], 2)]

    def order(seed, epoch, **kw):
        ld = make(entries, seed=seed, **kw)
        ld.set_epoch(epoch)
        return [(k, s, i) for k, _, s, i in rows(ld)]

    first = order(3, 1)
    assert order(3, 1, batch_size=7, threads=2) == first  # batching and threads change nothing
    assert order(4, 1) != first
    assert order(3, 2) != first
    # A one-entry mixture reads its dataset in the dataset's own order.
    single = make(addresses[0], return_keys=True)
    alone = make([addresses[0]], return_keys=True)
    assert [k for _, _, ks in single for k in ks] == [k for _, _, ks in alone for k in ks]


def test_streamed_sources_are_refused(mix, tmp_path):
    addresses = [a for a, _ in mix]
    with pytest.raises(NotImplementedError, match="streamed mixtures are not supported"):
        make(addresses, stream=True)
    tar = addresses[0].replace(".manifest.json", "-000000.tar")
    with pytest.raises(NotImplementedError, match=r"mixture source 2 \('pipe:cat .*random access"):
        make(addresses[:2] + ["pipe:cat " + tar])


@pytest.mark.parametrize("bad,match", [
    (42, "source must be a dataset address or a list"),
    ([], "empty list"),
    ("TUPLE", "looks like one .address, weight. entry"),
    ({"address": "A"}, "wrap it in a list"),
    ([42], r"mixture entry 0 \(42\): an entry is"),
    (["A", ("B", "x")], r"mixture entry 1 \(\('lmdb:.*', 'x'\)\): weight must be a number, not 'x'"),
    ([("A", 1, 2)], "mixture entry 0 .*a tuple entry is .address, weight."),
    ([{"address": "A", "weigth": 2}], "mixture entry 0 .*unknown key weigth"),
    ([{"weight": 2}], "mixture entry 0 .*no address"),
    ([{"address": ""}], "address must be a non-empty string"),
    ([{"address": "A", "repeat": 1, "choose": 2}], "repeat or choose, not both"),
    ([{"address": "A", "choose": 2.5}], "choose must be an integer"),
    ([{"address": "A", "choose": True}], "choose must be an integer"),
    ([{"address": "A", "label_offset": -1}], "label_offset must be >= 0"),
    ([("A", float("nan"))], "weight must be finite"),
    ([("A", -1)], "weight must be >= 0"),
    ([("A", 0), {"address": "B", "choose": 3}], "add up to 0"),
])
def test_bad_entries_raise_value_error_naming_the_entry(mix, bad, match):
    a, b = mix[0][0], mix[1][0]

    def fill(x):  # "A" and "B" stand for real addresses
        if isinstance(x, str):
            return {"A": a, "B": b}.get(x, x)
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(fill(v) for v in x)
        return x

    source = (a, 2.0) if bad == "TUPLE" else fill(bad)
    with pytest.raises(ValueError, match=match):
        make(source)


def test_library_errors_name_the_source(mix, tmp_path):
    addresses = [a for a, _ in mix]
    with pytest.raises(shardkit.Error, match=r"mixture source 1 \('lmdb:.*nothere"):
        make([addresses[0], "lmdb:" + str(tmp_path / "nothere"), addresses[2]])
    # A state of one mixture does not load into another.
    state = make(addresses).state_dict()
    assert state["shardkit_loader"]["sources"] == [{"samples": n, "per_epoch": 10} for n in SIZES]
    with pytest.raises(shardkit.Error, match="mixture of 3 sources"):
        make([addresses[0], {"address": addresses[1], "choose": 4}, addresses[2]]).load_state_dict(state)
    with pytest.raises(shardkit.Error, match="one dataset"):
        make(addresses[0]).load_state_dict(state)


def test_what_the_loader_reports_for_a_mixture(mix):
    addresses = [a for a, _ in mix]
    ld = make([(addresses[0], 3), {"address": addresses[1], "repeat": 2, "label_offset": 3}, addresses[2]],
              threads=2)
    assert ld.decoder == "cpu" and ld.threads == 2
    assert (ld.rank, ld.world_size) == (0, 1)
    assert ld.class_names == []  # each source's own: shardkit.info(address)["class_names"]
    assert ld.sources[1] == {"address": addresses[1], "weight": 1.0, "repeat": 2.0, "choose": 0,
                             "label_offset": 3, "samples": 10, "per_epoch": 20}
    assert [s["per_epoch"] for s in ld.sources] == [15, 20, 5]
    assert ld.epoch_size == 40 and len(ld) == 10 and ld.batches_left == 10
    assert "mixture of 3" in repr(ld)
    assert sum(1 for _ in ld) == 10 and ld.batches_left == 0
    s = ld.input_stats()
    assert s["batches"] == 10 and s["images_host"] == 40
    # The earlier keyword name of the first argument.
    assert shardkit.Loader(address=addresses[1], batch_size=4, rank=0, world_size=1).epoch_size == 10
