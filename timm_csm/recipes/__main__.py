"""``python -m timm_csm.recipes --profile demo``: the main job (see :mod:`timm_csm.recipes.run`)."""
from .run import main

main()
