"""The target-side caches' size budget: least recently used first, the current run's files spared."""

import os
import time

from draftwheel.training.cache_budget import prune
from draftwheel.training.eagle_train import cached_continuations


def _file(path, size, age_s):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_prune_deletes_the_least_recently_used_until_the_cache_fits(tmp_path):
    old = _file(tmp_path / "rows" / "old.safetensors", 400, age_s=300)
    middle = _file(tmp_path / "continuations" / "mid.json", 400, age_s=200)
    recent = _file(tmp_path / "rows" / "recent.safetensors", 400, age_s=100)
    pruned = prune(tmp_path, max_bytes=800, keep_since=time.time())
    assert (pruned.files, pruned.freed, pruned.kept_bytes) == (1, 400, 800)
    assert not old.exists() and middle.exists() and recent.exists()


def test_prune_spares_what_the_current_run_used_even_over_budget(tmp_path):
    began = time.time() - 50
    old = _file(tmp_path / "rows" / "old.safetensors", 400, age_s=300)
    used = [_file(tmp_path / "rows" / f"used{i}.safetensors", 400, age_s=10) for i in range(3)]
    pruned = prune(tmp_path, max_bytes=500, keep_since=began)
    assert not old.exists() and all(p.exists() for p in used)
    assert pruned.kept_bytes == 1200 and pruned.files == 1  # over budget: the run's own set stays whole


def test_prune_takes_interrupted_writes_first_and_a_zero_budget_keeps_everything(tmp_path):
    rows = _file(tmp_path / "rows" / "a.safetensors", 400, age_s=300)
    partial = _file(tmp_path / "rows" / "b.tmp", 400, age_s=10)
    assert prune(tmp_path, max_bytes=0, keep_since=time.time()).kept_bytes == 800
    assert prune(tmp_path, max_bytes=500, keep_since=time.time()).files == 1
    assert rows.exists() and not partial.exists()
    assert prune(tmp_path / "absent", max_bytes=1).kept_bytes == 0


def test_a_cache_read_makes_the_entry_recently_used(tmp_path):
    generated = []

    def generate(missing):
        generated.extend(missing)
        return [[7, 8] for _ in missing]

    folder = tmp_path / "continuations"
    cached_continuations(folder, ["sha"], [[1, 2], [3]], [2, 2], generate)
    first, second = sorted(folder.glob("*.json"))
    for path in (first, second):
        os.utime(path, (time.time() - 500, time.time() - 500))
    cached_continuations(folder, ["sha"], [[1, 2]], [2], generate)  # reads one of the two back
    assert generated == [0, 1]
    prune(tmp_path, max_bytes=first.stat().st_size, keep_since=time.time() - 60)
    assert len(list(folder.glob("*.json"))) == 1  # the entry read back is the one kept
    assert cached_continuations(folder, ["sha"], [[1, 2]], [2], generate)[1] == []
