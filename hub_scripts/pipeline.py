"""The main job end to end (see timm_csm.pipeline): `python hub_scripts/pipeline.py --profile demo`."""
from timm_csm.pipeline import main

if __name__ == "__main__":
    main()
