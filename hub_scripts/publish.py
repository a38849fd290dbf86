"""Same as `timm-csm-publish` (timm_csm/commands/publish.py), for a source checkout."""
import sys

from timm_csm.commands.publish import main

if __name__ == "__main__":
    sys.exit(main())
