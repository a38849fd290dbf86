"""PNG grids of a generator's samples: one row per class pair, one column per lambda."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .conditioning import mix_weights
from .sampling import sample_with_scheduler, to_uint8

__all__ = ["save_sample_grid", "tile_images"]


def tile_images(images_uint8: np.ndarray, rows: int, cols: int, pad: int = 1) -> np.ndarray:
    """(rows*cols, C, H, W) uint8 -> one (H', W', C) image with ``pad`` pixels of white between tiles."""
    n, c, h, w = images_uint8.shape
    canvas = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, np.uint8)
    for k in range(min(n, rows * cols)):
        r, q = divmod(k, cols)
        canvas[pad + r * (h + pad): pad + r * (h + pad) + h, pad + q * (w + pad): pad + q * (w + pad) + w] = \
            images_uint8[k].transpose(1, 2, 0)
    return canvas


@torch.no_grad()
def save_sample_grid(unet, scheduler, num_classes: int, path, num_lambdas: int = 8, seed: int = 0,
                     num_inference_steps: int = 50, guidance_scale: float = 1.0) -> Path:
    """Row k morphs class k (lambda = 1, left) into class (k + 1) mod K (lambda = 0, right), same noise per row."""
    from PIL import Image

    device = next(unet.parameters()).device
    size, ch = unet.config.sample_size, unet.config.in_channels
    lams = torch.linspace(1, 0, num_lambdas)
    a = torch.arange(num_classes).repeat_interleave(num_lambdas)
    b = (a + 1) % num_classes
    w = mix_weights(a, b, lams.repeat(num_classes), num_classes)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(num_classes, ch, size, size, generator=g).repeat_interleave(num_lambdas, 0)
    x = sample_with_scheduler(unet, scheduler, w.to(device), noise.to(device), num_inference_steps, guidance_scale)
    grid = tile_images(to_uint8(x).cpu().numpy(), num_classes, num_lambdas)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(path)
    return path
