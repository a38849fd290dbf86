"""Class names of the label dimensions of the paper's EDM generators: CIFAR-10 (10) and CIFAR-100 (100).

The names and their order are those of the datasets' releases (Krizhevsky, 2009: ``batches.meta`` and ``meta``,
CIFAR-100's fine labels), the label indices the EDM conditional models were trained with. The Hub's
``uoft-cs/cifar100`` spells class 26 ``cra``; give that dataset's names (``class_names=``) to match it exactly.
"""
from __future__ import annotations

from typing import List

__all__ = ["CIFAR10_CLASSES", "CIFAR100_CLASSES", "default_class_names"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

CIFAR100_CLASSES = tuple("""
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can castle
caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin elephant flatfish
forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle
mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine
possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar
sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale
willow_tree wolf woman worm
""".split())


def default_class_names(label_dim: int) -> List[str]:
    """The CIFAR-10 or CIFAR-100 names for a label dimension of 10 or 100; any other needs explicit names."""
    names = {len(CIFAR10_CLASSES): CIFAR10_CLASSES, len(CIFAR100_CLASSES): CIFAR100_CLASSES}.get(label_dim)
    if names is None:
        raise ValueError(f"the network has {label_dim} classes and no default names (CIFAR-10: 10, CIFAR-100: 100); "
                         "give class_names (one per class, in label order)")
    return list(names)
