"""Same as `timm-csm-annotate` (timm_csm/commands/annotate.py), for a source checkout."""
import sys

from timm_csm.commands.annotate import main

if __name__ == "__main__":
    sys.exit(main())
