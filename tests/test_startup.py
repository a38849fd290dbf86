"""Start-up stays lean: ``import timm_csm`` loads none of the heavy optional libraries, and every console command's
``--help`` loads no third-party package beyond what ``import torch, timm`` loads (each in a fresh child of one
interpreter that has imported torch and timm only, its modules read from ``sys.modules``)."""
import configparser
import json
import subprocess
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[1] / "setup.cfg"
HEAVY = ("diffusers", "open_clip", "datasets", "evaluate", "matplotlib", "scipy")

# one interpreter imports torch and timm, then forks a child for ``import timm_csm`` and one per command: the child
# reports the top-level packages it loaded beyond the parent's, leaving out the standard library and timm_csm
CHILDREN = r"""
import importlib, io, json, os, sys
import torch, timm
base = {m.partition('.')[0] for m in sys.modules}
heavy, commands = json.loads(sys.argv[1])
report = {'parent': sorted(base & set(heavy))}
for name, target in {'import timm_csm': 'timm_csm:', **commands}.items():
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        sys.argv, sys.stdout, sys.stderr = [name, '--help'], io.StringIO(), io.StringIO()
        module, _, function = target.partition(':')
        try:
            entry = importlib.import_module(module)
            if function:
                getattr(entry, function)()
        except SystemExit:
            pass
        loaded = {m.partition('.')[0] for m in sys.modules} - base - set(sys.stdlib_module_names) - {'timm_csm'}
        usage = 'usage' in sys.stdout.getvalue() or not function
        os.write(write, json.dumps({'help': usage, 'loaded': sorted(loaded)}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report[name] = json.loads(pipe.read())
    os.wait()
print(json.dumps(report))
"""


def console_scripts():
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    lines = config["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines)


def test_import_and_every_command_help_load_nothing_beyond_torch_and_timm():
    commands = console_scripts()
    assert "timm-csm-calibrate" in commands and len(commands) >= 9
    out = subprocess.run([sys.executable, "-c", CHILDREN, json.dumps([HEAVY, commands])], capture_output=True,
                         text=True, check=True).stdout
    report = json.loads(out)
    assert report.pop("parent") == []  # torch and timm load none of them: the children's checks mean something
    assert sorted(report) == sorted(["import timm_csm", *commands])
    assert all(r["help"] for r in report.values()), report  # each command printed its usage
    assert {name: r["loaded"] for name, r in report.items() if r["loaded"]} == {}
