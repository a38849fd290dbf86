"""The main job end to end (see timm_csm.recipes): `python hub_scripts/pipeline.py --profile demo`; the paper's GPU
recipe with the user's files, rehearsed at toy size first:
`python hub_scripts/pipeline.py --profile full --generator edm-cifar100-cond-32x32-cond-vp.pkl --rehearse`."""
from timm_csm.recipes import main

if __name__ == "__main__":
    main()
