"""Same as `timm-csm-generate` (timm_csm/commands/generate.py), for a source checkout."""
import sys

from timm_csm.commands.generate import main

if __name__ == "__main__":
    sys.exit(main())
