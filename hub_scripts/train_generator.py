"""Same as `timm-csm-train-generator` (timm_csm/commands/train_generator.py), for a source checkout."""
from timm_csm.commands.train_generator import main

if __name__ == "__main__":
    main()
