"""``python -m timm_csm.recipes --profile demo``: the main job (see :mod:`timm_csm.recipes.run`)."""
import sys

from .run import main

sys.exit(main())
