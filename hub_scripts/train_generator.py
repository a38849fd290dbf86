"""Same as `timm-csm-train-generator` (timm_csm/commands/train_generator.py), for a source checkout."""
import sys

from timm_csm.commands.train_generator import main

if __name__ == "__main__":
    sys.exit(main())
