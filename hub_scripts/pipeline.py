"""The main job end to end (see timm_csm.recipes): `python hub_scripts/pipeline.py --profile demo`."""
from timm_csm.recipes import main

if __name__ == "__main__":
    main()
