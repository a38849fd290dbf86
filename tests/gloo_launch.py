"""Run a worker script on 2 CPU processes over gloo with ``accelerate launch``."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def launch_two_processes(script, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """``accelerate launch --num_processes 2 script args``, single-threaded; asserts a zero exit status."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script), *map(str, args)]
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{SCRIPTS}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
