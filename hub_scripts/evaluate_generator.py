"""Same as `timm-csm-evaluate-generator` (timm_csm/commands/evaluate_generator.py), for a source checkout."""
import sys

from timm_csm.commands.evaluate_generator import main

if __name__ == "__main__":
    sys.exit(main())
