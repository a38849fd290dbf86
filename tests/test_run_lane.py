"""The lanes that run the protocol's remaining cells (benchmarks/run_lane.py): claims, retries, the cells listed and
the copy of a finished cell into the committing tree."""
import threading

from benchmark_scripts import load_benchmark

lane = load_benchmark("run_lane")


def test_two_lanes_sharing_claims_run_each_cell_once(tmp_path):
    cells = [lane.Cell(f"c{i}", []) for i in range(12)]
    ran, lock = [], threading.Lock()

    def run(cell):
        with lock:
            ran.append(cell.key)
        return True

    lanes = [threading.Thread(target=lane.run_lane, args=(lambda: cells, run, tmp_path / "claims"),
                              kwargs={"once": True, "log": lambda m: None}) for _ in range(2)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    assert sorted(ran) == sorted(c.key for c in cells)  # every cell, none twice


def test_a_cell_that_does_not_finish_is_released_and_tried_again_after_the_wait(tmp_path):
    now = [0.0]
    attempts = []
    pending = {"a", "b"}

    def list_cells():  # a finished cell drops out of the list, as the protocol's --next does
        return [lane.Cell(k, []) for k in sorted(pending)]

    def run(cell):
        attempts.append((cell.key, now[0]))
        if cell.key == "a" and now[0] < 500:  # its generated set is not built yet
            return False
        pending.discard(cell.key)
        return True

    def sleep(seconds):
        now[0] += seconds
        if not pending:
            raise StopIteration

    claims = tmp_path / "claims"
    try:
        lane.run_lane(list_cells, run, claims, retry_after=600, wait=300, log=lambda m: None, clock=lambda: now[0],
                      sleep=sleep)
    except StopIteration:
        pass
    # "a" fails at 0 and is released; "b" runs; "a" waits out its 600 s (two looks at 300 s each), then finishes
    assert attempts == [("a", 0.0), ("b", 0.0), ("a", 600.0)]
    assert sorted(p.name for p in claims.iterdir()) == ["a", "b"]  # finished cells stay claimed
    assert lane.run_lane(lambda: [lane.Cell("a", [])], run, claims, once=True, log=lambda m: None) == 0


def test_the_amendment2_cells_list_a_cell_shared_by_the_settings_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no committed cell, no cache: stage 1 of both settings
    cells = lane.amendment2_cells(["matched", "annotated"], tmp_path / "cache")
    keys = [c.key for c in cells]
    assert len(keys) == len(set(keys)) and "ce-s0" in keys
    assert any(k.startswith("kd") and k.endswith("-annotated-s0") for k in keys)
    ce = next(c for c in cells if c.key == "ce-s0")
    assert ce.command[ce.command.index("--recipe") + 1] == "matched"  # listed under the first setting
    assert ce.command[ce.command.index("--methods") + 1:ce.command.index("--methods") + 4] == ["ce", "--seeds", "0"]


def test_a_cell_runs_in_its_tree_and_its_committed_folder_is_copied_back(tmp_path):
    tree, here = tmp_path / "tree", tmp_path / "here"
    tree.mkdir()
    here.mkdir()
    write = ("import pathlib, sys; d = pathlib.Path('benchmarks/cells_a2') / sys.argv[1]; "
             "d.mkdir(parents=True, exist_ok=True); (d / sys.argv[2]).write_text('{}')")
    log = tmp_path / "logs" / "cell.log"
    assert lane.run_in_tree(lane.Cell("ce-s0", ["-c", write + "; print('trained')", "ce-s0", "results.json"]), tree,
                            here, log)
    assert (here / "benchmarks/cells_a2/ce-s0/results.json").read_text() == "{}"
    assert log.read_text() == "trained\n"  # the cell's output goes to its log
    # a shift cell gets the committed amendment-2 folder in its tree first, and brings back its shift.json
    assert lane.run_in_tree(lane.Cell("a3--ce-s0", ["-c", write, "ce-s0", "shift.json"]), tree, here, log)
    assert (here / "benchmarks/cells_a2/ce-s0/shift.json").exists()
    # a cell that leaves no finished file did not finish; nothing is copied
    assert not lane.run_in_tree(lane.Cell("ce-s1", ["-c", "import sys; sys.exit(3)"]), tree, here, log)
    assert not (here / "benchmarks/cells_a2/ce-s1").exists()
