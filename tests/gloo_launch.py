"""Run a worker script on 2 CPU processes over gloo with ``accelerate launch``; workers end through
:func:`run_worker`."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS / "scripts"


def free_port() -> int:
    """A TCP port free now: launches in parallel test workers must not share torch's default rendezvous port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_two_processes(script, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """``accelerate launch --num_processes 2 script args``, single-threaded; asserts a zero exit status."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
           "--dynamo_backend", "no", str(script), *map(str, args)]
    path = os.pathsep.join(map(str, (ROOT, SCRIPTS, TESTS)))
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_worker(main, *args):
    """``main(*args)``, then the process group is destroyed, also when ``main`` raises: a worker that exits right
    after a gloo collective otherwise races gloo's thread freeing the last work object during interpreter
    shutdown and aborts (SIGABRT) about one run in five."""
    from timm_csm.cli import end_process_group

    try:
        return main(*args)
    finally:
        end_process_group()
