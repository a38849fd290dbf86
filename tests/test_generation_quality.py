"""Generator quality measurements: the classifier two-sample test."""
import torch

from timm_csm.generation import two_sample_accuracy


def test_two_sample_test_separates_shifted_images_and_not_identical_ones():
    g = torch.Generator().manual_seed(0)
    real = torch.randint(0, 128, (400, 1, 16, 16), generator=g, dtype=torch.uint8)
    same = torch.randint(0, 128, (400, 1, 16, 16), generator=g, dtype=torch.uint8)
    brighter = torch.randint(64, 192, (400, 1, 16, 16), generator=g, dtype=torch.uint8)
    assert two_sample_accuracy(real, brighter, epochs=5) > 0.95
    assert abs(two_sample_accuracy(real, same, epochs=5) - 0.5) < 0.1
