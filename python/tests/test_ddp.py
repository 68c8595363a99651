"""shardkit.Loader under torchrun on the CPU (gloo): the rank/world logic of DDP training.

Each test launches `python -m torch.distributed.run --standalone --nproc_per_node=2`
over a worker script (written to tmp_path) that builds shardkit.Loader with its defaults
for rank and world size (torchrun's RANK / WORLD_SIZE), runs a collective after every
batch (as DDP's gradient all-reduce does: a rank that ran out of batches first would
hang it, so the launch has a timeout) and writes what it saw as JSON.
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch without torch.distributed / gloo", allow_module_level=True)

WORKER = r'''
import json, os, sys
import torch
import torch.distributed as dist
import shardkit

address, out, phase, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
loader = shardkit.Loader(address, batch_size=5, seed=11, threads=1, output_size=16, dtype="uint8",
                         return_keys=True, drop_last=False)
assert (loader.rank, loader.world_size) == (rank, world), (loader.rank, loader.world_size, rank, world)
loader.set_epoch(3)
res = {"rank": rank, "len": len(loader)}

def step(keys):
    # DDP's all-reduce after every step: every rank must take part the same number of times.
    t = torch.tensor([len(keys)], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())

if phase == "full":
    res["batches"] = []
    res["global"] = []
    for images, labels, keys in loader:
        assert images.shape[0] == len(keys) == labels.shape[0]
        res["batches"].append(list(keys))
        res["global"].append(step(keys))
elif phase == "save":
    it = iter(loader)
    res["before"] = []
    for _ in range(2):
        images, labels, keys = next(it)
        res["before"].append(list(keys))
        step(keys)
    with open(os.path.join(out, f"state-{rank}.json"), "w") as f:
        json.dump(loader.state_dict(), f)
elif phase == "resume":
    with open(os.path.join(out, f"state-{rank}.json")) as f:
        loader.load_state_dict(json.load(f))
    res["after"] = []
    for images, labels, keys in loader:
        res["after"].append(list(keys))
        step(keys)
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump(res, f)
dist.barrier()
dist.destroy_process_group()
'''


def run_group(cmd, env, timeout):
    """subprocess.run in a process group of its own: on a timeout the whole group (the
    launcher and the workers it started) is killed, not only the launcher."""
    import signal
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any worker left behind by a launcher that exited
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(tmp_path, address, phase, world=2):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # --redirects 1 --tee 1 (stdout to a log and to ours): torch 1.13's torchrun on Python 3.11
    # cannot parse its own default "0" (IntFlag iteration changed); harmless on newer torch.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           "--redirects", "1", "--tee", "1", str(script), address, str(out), phase, str(world)]
    # The launch's own rendezvous (a TCP store on a free port, gloo's connections) can fail
    # on a loaded machine before the worker runs a line of ours ("Broken pipe", "Connection
    # reset"): such a launch is retried, at most twice. A failure in the worker is not.
    for attempt in range(3):
        p = run_group(cmd, env, timeout=240)
        text = p.stdout + p.stderr
        launch_failed = any(w in text for w in ("Broken pipe", "Connection reset", "DistNetworkError",
                                                "address already in use"))
        if p.returncode == 0 or not launch_failed or (out / f"{phase}-0.json").exists():
            break
    assert p.returncode == 0, f"torchrun {phase} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return [json.loads((out / f"{phase}-{r}.json").read_text()) for r in range(world)]


def test_every_rank_yields_equal_disjoint_batches(data, tmp_path):
    address, samples, _ = data
    ranks = torchrun(tmp_path, address, "full")
    counts = [len(r["batches"]) for r in ranks]
    # Equal batch counts, as len(loader) says on every rank: no collective waits on a missing batch.
    assert counts[0] == counts[1] == ranks[0]["len"] == ranks[1]["len"] > 0
    seen = [k for r in ranks for b in r["batches"] for k in b]
    per_rank = [set(k for b in r["batches"] for k in b) for r in ranks]
    assert not (per_rank[0] & per_rank[1]), "a sample went to both ranks"
    # 24 samples split 12/12: every sample exactly once across the ranks.
    assert sorted(seen) == sorted(samples)
    # The all-reduced batch sizes agree on both ranks, step by step.
    assert ranks[0]["global"] == ranks[1]["global"]


def test_checkpoint_mid_epoch_resumes_on_the_same_world(data, tmp_path):
    address, samples, _ = data
    full = torchrun(tmp_path, address, "full")
    torchrun(tmp_path, address, "save")
    # A new torchrun (new processes) continues from the checkpoint.
    resumed = torchrun(tmp_path, address, "resume")
    saved = [json.loads((tmp_path / "out" / f"save-{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        assert saved[r]["before"] == full[r]["batches"][:2]
        assert resumed[r]["after"] == full[r]["batches"][2:], f"rank {r} did not resume where it stopped"
    assert len(resumed[0]["after"]) == len(resumed[1]["after"])


def test_rank_threads_share_the_host_under_torchrun(data, monkeypatch):
    # threads=0 under torchrun with G local ranks and no pinning: each rank takes mask / G.
    # The library decides (one definition, LoaderOptions::local_world_size); Loader.threads
    # reports it.
    import shardkit

    address = data[0]
    mask = len(os.sched_getaffinity(0))
    pinned = mask < (os.cpu_count() or mask)

    def threads():
        return shardkit.Loader(address, batch_size=2, threads=0, rank=0, world_size=1).threads

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads() == (mask if pinned else max(1, mask // 2))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert threads() == mask  # one rank: the whole mask
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert threads() == mask
    assert shardkit.Loader(address, batch_size=2, threads=3, rank=0, world_size=1).threads == 3
