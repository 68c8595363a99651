"""Exact resume on another number of ranks (state version 2), under torchrun on the CPU.

Three launches of `python -m torch.distributed.run --standalone` (gloo), each rank
building shardkit.Loader with torchrun's RANK / WORLD_SIZE and all-reducing after every
batch (as DDP does: a rank with fewer batches would hang the launch), over one dataset
(40 samples in tar shards) and over a mixture of three formats (40 samples per epoch):

  4 ranks: a whole epoch (the reference order); then the epoch again, stopped after 2
           batches of 2, rank 0's state_dict() saved to a file;
  3 ranks: that state loaded and the epoch finished; loaded again, 2 batches, rank 0's
           state saved; that state loaded by a third loader on the same 3 ranks;
  6 ranks: the 3-rank state loaded and the epoch finished; the 4-rank state likewise.

The sizes divide evenly (16 positions consumed by 4 ranks, 24 left = 3 x 8 = 6 x 4; 12
more consumed by 3 ranks, 12 left = 6 x 2), so no run pads; the padding and drop_last
rules on what is left of an epoch are checked in-process below with explicit ranks. A
row is named by (source, item): items are distinct within an epoch, keys are not where a
mixture repeats a source.
"""
import collections
import json
import os
import sys

import pytest

import shardkit

from conftest import make_image_folder, make_mixture_sources, make_tar_shards
from test_ddp import run_group

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch without torch.distributed / gloo", allow_module_level=True)
pytestmark = pytest.mark.skipif(not shardkit.HAVE_LOADER, reason="no loader in this build")

BATCH = 2
EPOCH = 1
SEED = 5
N = 40

WORKER = r'''
import json, os, sys
import torch
import torch.distributed as dist
import shardkit

cfg = json.loads(open(sys.argv[1]).read())
out, phase = sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def make(name):
    ld = shardkit.Loader(cfg["sources"][name], batch_size=cfg["batch"], seed=cfg["seed"], threads=1, prefetch=2,
                         output_size=8, dtype="uint8", return_keys=True, return_sources=True)
    assert (ld.rank, ld.world_size) == (rank, world)
    return ld

def step(n):
    # DDP's all-reduce after every step: every rank takes part the same number of times.
    t = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())

def rows(ld, limit=None):
    """Rows [key, source, item] of each batch, up to `limit` batches, from the raw batches
    (the order a `for` yields; the items are not in the yielded tuple)."""
    got = []
    while limit is None or len(got) < limit:
        b = ld._loader.next()
        if b is None:
            break
        srcs = torch.from_dlpack(b.sources()).tolist()
        got.append([[k, s, i] for k, s, i in zip(b.keys, srcs, b.indices)])
        b.drop()
        step(len(got[-1]))
    return got

def save(ld, path):
    if rank == 0:
        with open(path, "w") as f:
            json.dump(ld.state_dict(), f)
    dist.barrier()

def load(ld, path):
    with open(path) as f:
        ld.load_state_dict(json.load(f))

res = {}
for name in sorted(cfg["sources"]):
    r = res[name] = {}
    ld = make(name)
    if phase == "w4":
        ld.set_epoch(cfg["epoch"])
        r["len"] = len(ld)
        r["full"] = rows(ld)
        # A `for` as training runs it, stopped after 2 batches.
        ld.set_epoch(cfg["epoch"])
        r["before"] = []
        for images, labels, keys, sources in ld:
            r["before"].append([[k, s] for k, s in zip(keys, sources.tolist())])
            step(len(keys))
            if len(r["before"]) == 2:
                break
        r["state"] = ld.state_dict()
        save(ld, os.path.join(out, f"{name}-w4.json"))
    elif phase == "w3":
        load(ld, os.path.join(out, f"{name}-w4.json"))
        r["len"], r["left"] = len(ld), ld.batches_left
        r["rest"] = rows(ld)
        r["left_after"] = ld.batches_left
        ld2 = make(name)
        load(ld2, os.path.join(out, f"{name}-w4.json"))
        r["before"] = rows(ld2, 2)
        r["state"] = ld2.state_dict()
        save(ld2, os.path.join(out, f"{name}-w3.json"))
        # The same world size again: a plan that began mid-epoch continues at its batch.
        ld3 = make(name)
        load(ld3, os.path.join(out, f"{name}-w3.json"))
        r["again"] = rows(ld3)
        # The next epoch is whole again.
        ld3.set_epoch(cfg["epoch"] + 1)
        r["next_len"], r["next_left"] = len(ld3), ld3.batches_left
        r["next"] = rows(ld3)
    elif phase == "w6":
        load(ld, os.path.join(out, f"{name}-w3.json"))
        r["len"], r["left"] = len(ld), ld.batches_left
        r["rest"] = rows(ld)
        ld2 = make(name)
        load(ld2, os.path.join(out, f"{name}-w4.json"))
        r["from4"] = rows(ld2)
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump(res, f)
dist.barrier()
dist.destroy_process_group()
'''


def torchrun(tmp, cfg, phase, world):
    script = tmp / "worker.py"
    script.write_text(WORKER)
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # --redirects 1 --tee 1: as test_ddp.py (torch 1.13's torchrun on Python 3.11).
    # --monitor_interval: the launcher looks at its workers every 5 s by default, so a
    # launch would wait up to 5 s after its workers are done.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           "--monitor_interval", "0.2", "--redirects", "1", "--tee", "1", str(script), str(tmp / "cfg.json"),
           str(out), phase]
    for attempt in range(3):  # a failed rendezvous is retried, as in test_ddp.py
        p = run_group(cmd, env, timeout=240)
        text = p.stdout + p.stderr
        launch_failed = any(w in text for w in ("Broken pipe", "Connection reset", "DistNetworkError",
                                                "address already in use"))
        if p.returncode == 0 or not launch_failed or (out / f"{phase}-0.json").exists():
            break
    assert p.returncode == 0, f"torchrun {phase} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return [json.loads((out / f"{phase}-{r}.json").read_text()) for r in range(world)]


def mixture_entries(parts):
    # 12 tar + 8 MDS samples weighted 3:1 (15 and 5: a pass and 3 of a second, and 5 of
    # 8) and the LMDB's 10 twice: 40 positions per epoch.
    (a, _), (b, _), (c, _) = parts
    return [(a, 3), {"address": b, "repeat": 2, "label_offset": 3}, {"address": c, "weight": 1, "label_offset": 5}]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    samples = make_image_folder(str(tmp / "imgs"), classes=("ant", "bee", "cow", "doe", "elk"), per_class=8)
    single = make_tar_shards(str(tmp / "tar"), samples, per_shard=7)
    parts = make_mixture_sources(str(tmp / "mix"))
    return {"single": single, "mix": mixture_entries(parts)}


@pytest.fixture(scope="module")
def runs(sets, tmp_path_factory):
    """The three launches' results: {"w4": [per rank], "w3": [...], "w6": [...]}."""
    tmp = tmp_path_factory.mktemp("runs")
    cfg = {"sources": sets, "batch": BATCH, "seed": SEED, "epoch": EPOCH}
    return {"w4": torchrun(tmp, cfg, "w4", 4), "w3": torchrun(tmp, cfg, "w3", 3), "w6": torchrun(tmp, cfg, "w6", 6)}


def merge(per_rank):
    """Ranks' rows (lists of batches) in global order: rank r's k-th row is position r + k*W."""
    flat = [[row for batch in r for row in batch] for r in per_rank]
    w = len(flat)
    assert len(set(len(f) for f in flat)) == 1, "ranks yielded different numbers of rows"
    return [flat[p % w][p // w] for p in range(w * len(flat[0]))]


def ident(row):
    return tuple(row[:2])  # (key, source); rows from a `for` carry no item


def check_rest(order, start, per_rank, label, end=None):
    """Ranks' rows from global position `start`: exactly order[start:end] (to the epoch's
    end by default), rank r's k-th row at position start + r + k * W."""
    got = merge(per_rank)
    assert [tuple(r) for r in got] == [tuple(r) for r in order[start:end]], label


@pytest.mark.parametrize("name", ["single", "mix"])
def test_4_ranks_stopped_then_3_ranks_finish_the_epoch_exactly(runs, name):
    w4 = [r[name] for r in runs["w4"]]
    w3 = [r[name] for r in runs["w3"]]
    order = merge([r["full"] for r in w4])
    assert len(order) == N and len(set((s, i) for _, s, i in order)) == N  # every position its own item
    state = w4[0]["state"]["shardkit_loader"]
    assert (state["version"], state["world_size"], state["next_batch"], state["position"]) == (2, 4, 2, 16)
    assert all(r["state"]["shardkit_loader"]["position"] == 16 for r in w4)  # ranks move in step
    before = merge([r["before"] for r in w4])
    assert before == [row[:2] for row in order[:16]]  # the `for` yields the plan's rows
    # The 3 ranks: 24 positions left, 8 each in 4 batches; len() is still a whole epoch's.
    assert [(r["len"], r["left"], r["left_after"]) for r in w3] == [(7, 4, 0)] * 3
    check_rest(order, 16, [r["rest"] for r in w3], "4 -> 3 ranks")
    # The multiset of what was delivered is the epoch's: nothing twice, nothing missed.
    delivered = [ident(row) for row in before] + [ident(row) for r in w3 for b in r["rest"] for row in b]
    assert collections.Counter(delivered) == collections.Counter(ident(row) for row in order)


@pytest.mark.parametrize("name", ["single", "mix"])
def test_4_then_3_then_6_ranks(runs, name):
    w4, w3, w6 = ([r[name] for r in runs[p]] for p in ("w4", "w3", "w6"))
    order = merge([r["full"] for r in w4])
    state = w3[0]["state"]["shardkit_loader"]
    assert (state["world_size"], state["start"], state["next_batch"], state["position"]) == (3, 16, 2, 28)
    check_rest(order, 16, [r["before"] for r in w3], "3 ranks' first 2 batches", end=28)
    # Saved on 3 ranks after an elastic resume, loaded on 3: the plan from 16 continues.
    assert [r["again"] for r in w3] == [r["rest"][2:] for r in w3]
    # ... and on 6 ranks: 12 left, 2 each in one batch.
    assert [(r["len"], r["left"]) for r in w6] == [(4, 1)] * 6
    check_rest(order, 28, [r["rest"] for r in w6], "3 -> 6 ranks")
    items = ([(s, i) for _, s, i in order[:16]] + [(s, i) for r in w3 for b in r["before"] for _, s, i in b]
             + [(s, i) for r in w6 for b in r["rest"] for _, s, i in b])
    assert sorted(items) == sorted((s, i) for _, s, i in order) and len(set(items)) == N


@pytest.mark.parametrize("name", ["single", "mix"])
def test_4_then_6_ranks(runs, name):
    w4, w6 = ([r[name] for r in runs[p]] for p in ("w4", "w6"))
    order = merge([r["full"] for r in w4])
    check_rest(order, 16, [r["from4"] for r in w6], "4 -> 6 ranks")  # 24 left, 4 each, 2 batches


@pytest.mark.parametrize("name", ["single", "mix"])
def test_next_epoch_after_an_elastic_resume_is_whole(runs, sets, name):
    w3 = [r[name] for r in runs["w3"]]
    assert [(r["next_len"], r["next_left"]) for r in w3] == [(7, 7)] * 3
    # 40 on 3 ranks: 14 each, padded by the epoch's first 2 positions.
    got = merge([r["next"] for r in w3])
    ref = epoch_order(sets[name], EPOCH + 1)
    assert [tuple(r) for r in got] == [tuple(r) for r in ref + ref[:2]]


def epoch_order(source, epoch, world=1, **kw):
    """The global order of an epoch, merged from `world` loaders made in this process."""
    per_rank = []
    for r in range(world):
        ld = shardkit.Loader(source, batch_size=kw.get("batch_size", BATCH), seed=SEED, threads=1, output_size=8,
                             dtype="uint8", rank=r, world_size=world)
        ld.set_epoch(epoch)
        per_rank.append(raw_rows(ld))
    return merge(per_rank)


def raw_rows(ld, limit=None):
    got = []
    while limit is None or len(got) < limit:
        b = ld._loader.next()
        if b is None:
            break
        got.append([[k, s, i] for k, s, i in zip(b.keys, torch.from_dlpack(b.sources()).tolist(), b.indices)])
        b.drop()
    return got


@pytest.mark.parametrize("name", ["single", "mix"])
def test_global_order_is_the_same_on_1_2_and_4_ranks(runs, sets, name):
    four = merge([r[name]["full"] for r in runs["w4"]])
    assert [r[name]["len"] for r in runs["w4"]] == [5] * 4  # 10 each: 5 batches of 2
    one = epoch_order(sets[name], EPOCH)
    two = epoch_order(sets[name], EPOCH, world=2)
    assert [tuple(r) for r in one] == [tuple(r) for r in two] == [tuple(r) for r in four]
    assert one != epoch_order(sets[name], EPOCH + 1)


# In-process, with explicit ranks: the rules on what is left of an epoch.

def stop_and_state(source, world, batches, batch_size, **kw):
    lds = [shardkit.Loader(source, batch_size=batch_size, seed=SEED, threads=1, output_size=8, dtype="uint8",
                           rank=r, world_size=world, **kw) for r in range(world)]
    done = []
    for ld in lds:
        ld.set_epoch(EPOCH)
        done.append(raw_rows(ld, batches))
    return merge(done), lds[0].state_dict()


def resume(source, state, world, batch_size, **kw):
    per_rank = []
    for r in range(world):
        ld = shardkit.Loader(source, batch_size=batch_size, seed=SEED, threads=1, output_size=8, dtype="uint8",
                             rank=r, world_size=world, **kw)
        ld.load_state_dict(state)
        per_rank.append(raw_rows(ld))
    return per_rank


@pytest.mark.parametrize("name", ["single", "mix"])
def test_rest_of_the_epoch_is_padded_or_dropped_as_documented(sets, name):
    source = sets[name]
    order = epoch_order(source, EPOCH)
    # 4 ranks x 1 batch of 3 = 12 consumed; 28 left on 3 ranks.
    before, state = stop_and_state(source, 4, 1, 3)
    assert before == order[:12] and state["shardkit_loader"]["position"] == 12
    # drop_last=False: ceil(28 / 3) = 10 each, the last 2 wrap to the first positions left;
    # rank r's k-th row is position 12 + (r + 3k) mod 28.
    per_rank = resume(source, state, 3, 3)
    flat = [[row for b in r for row in b] for r in per_rank]
    assert [len(r) for r in per_rank] == [4] * 3 and [len(f) for f in flat] == [10] * 3
    for r in range(3):
        assert flat[r] == [order[12 + (r + 3 * k) % 28] for k in range(10)]
    # drop_last=True: floor(28 / 3) = 9 each, full batches of 3 only: 27 positions, 1 dropped.
    flat = [[row for b in r for row in b] for r in resume(source, state, 3, 3, drop_last=True)]
    for r in range(3):
        assert flat[r] == [order[12 + r + 3 * k] for k in range(9)]


@pytest.mark.parametrize("name", ["single", "mix"])
def test_another_batch_size_continues_from_the_global_position(sets, name):
    source = sets[name]
    order = epoch_order(source, EPOCH)
    before, state = stop_and_state(source, 1, 2, 5)  # 10 consumed by one rank
    assert before == order[:10]
    (rest,) = resume(source, state, 1, 3)
    assert [len(b) for b in rest] == [3] * 10
    assert [row for b in rest for row in b] == order[10:]


@pytest.mark.parametrize("name", ["single", "mix"])
def test_the_same_global_batch_size_gives_the_same_global_batches(sets, name):
    # 4 ranks x 2 and 2 ranks x 4: after the resume, every global step holds the samples
    # of the uninterrupted run's step, with the same pixels (crops and flips depend on
    # the seed, the epoch and the sample only).
    source = sets[name]

    def steps(lds):
        """Per global step: {(source, item): image bytes} over the ranks' batches."""
        out = []
        while True:
            step = {}
            for ld in lds:
                b = ld._loader.next()
                if b is None:
                    return out
                images = torch.from_dlpack(b.images()).clone()
                for k, (s, i) in enumerate(zip(torch.from_dlpack(b.sources()).tolist(), b.indices)):
                    step[(s, i)] = images[k].numpy().tobytes()
                b.drop()
            out.append(step)

    def loaders(world, batch_size):
        lds = [shardkit.Loader(source, batch_size=batch_size, seed=SEED, threads=1, output_size=8, dtype="uint8",
                               rank=r, world_size=world) for r in range(world)]
        for ld in lds:
            ld.set_epoch(EPOCH)
        return lds

    whole = steps(loaders(4, 2))
    assert [len(s) for s in whole] == [8] * 5
    first = loaders(4, 2)
    for ld in first:
        ld._loader.next().drop()
    state = first[0].state_dict()
    after = loaders(2, 4)
    for ld in after:
        ld.load_state_dict(state)
    assert steps(after) == whole[1:]


def test_a_version_1_state_resumes_only_on_the_same_world(sets):
    # Version 1 records a per-rank cursor: the same rank, world size and batch size only.
    source = sets["single"]
    _, state = stop_and_state(source, 1, 1, 4)
    s = state["shardkit_loader"]
    v1 = {"shardkit_loader": {k: s[k] for k in ("seed", "epoch", "next_batch", "num_samples", "rank",
                                                "world_size", "batch_size")}}
    v1["shardkit_loader"]["version"] = 1
    assert resume(source, v1, 1, 4) == resume(source, state, 1, 4)
    with pytest.raises(shardkit.Error, match="version-1 state"):
        resume(source, v1, 2, 4)
    with pytest.raises(shardkit.Error, match="version-1 state"):
        resume(source, v1, 1, 5)
