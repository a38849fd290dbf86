"""A timm user's own model and folder for the calibrate tests: scikit-learn's digits at 28 x 28 written as PNG class
folders named 1 ... 10 (digit d in folder d + 1, so that plain string order, 1, 10, 2, would permute the labels),
and a classifier trained on other digits outside this package, with its own normalisation, saved as plain
safetensors weights (no data config)."""
import numpy as np
import torch
import torch.nn.functional as F

#: the normalisation the model of :func:`train_classifier` is trained with (MNIST's, far from any timm default)
MEAN, STD = (0.1307,), (0.3081,)
SIDE = 28
FOLDER_NAMES = [str(d + 1) for d in range(10)]


def digits_28(split: str):
    """(uint8 (N, 1, 28, 28), labels (N,)) of a split of the package's digits, enlarged with PIL's bilinear."""
    from PIL import Image

    from timm_csm.data import load_digits

    data = load_digits(split)
    big = [np.asarray(Image.fromarray(img[0]).resize((SIDE, SIDE), Image.BILINEAR)) for img in data.images]
    return torch.from_numpy(np.stack(big)[:, None].copy()), torch.as_tensor(data.labels)


def write_digit_folder(root, splits=("val", "test"), per_split: int = 170):
    """``<split>/<d + 1>/<i>.png`` (``splits`` None: the flat ``<d + 1>/<i>.png``) of the first ``per_split``
    test digits each (different digits for each split); returns ``root``."""
    from PIL import Image

    images, labels = digits_28("test")
    for s, split in enumerate(splits or (None,)):
        for i in range(s * per_split, (s + 1) * per_split):
            folder = root / split / FOLDER_NAMES[labels[i]] if split else root / FOLDER_NAMES[labels[i]]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i, 0].numpy()).save(folder / f"{i}.png")
    return root


def normalise(images: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    return (images.float() / 255.0 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def train_classifier(name: str, images: torch.Tensor, labels: torch.Tensor, num_classes: int, epochs: int = 8,
                     seed: int = 0, mean=MEAN, std=STD, lr: float = 3e-3, batch_size: int = 16):
    """A timm model trained the plain PyTorch way on uint8 ``images`` at their own size, normalised with
    ``mean`` / ``std``: a model trained elsewhere. In eval mode."""
    import timm

    import timm_csm.models  # noqa: F401  (registers small_cnn)

    torch.manual_seed(seed)
    model = timm.create_model(name, num_classes=num_classes, in_chans=images.shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    x = normalise(images, mean, std)
    for _ in range(epochs):
        model.train()
        for rows in torch.randperm(len(x)).split(batch_size):
            loss = F.cross_entropy(model(x[rows]), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def save_weights(model, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def pattern_images(n_per_class: int, seed: int, noise: float = 60.0):
    """(uint8 (N, 1, 16, 16), labels) drawn as ``write_image_folder`` draws its images."""
    from csm_fixtures import class_patterns

    rng = np.random.default_rng(seed)
    patterns = class_patterns()
    images = [np.clip(patterns[k] + rng.normal(0, noise, patterns[k].shape), 0, 255).astype(np.uint8)
              for k in range(len(patterns)) for _ in range(n_per_class)]
    return torch.from_numpy(np.stack(images)[:, None]), torch.arange(len(patterns)).repeat_interleave(n_per_class)


def pattern_model_files(root):
    """(image folder, weights file): a folder of three classes of 16 x 16 patterns and a small_cnn trained on other
    images of them (calibrate refuses a model at chance), saved as plain weights, as a user brings them."""
    from csm_fixtures import write_image_folder

    data = write_image_folder(root / "data")
    model = train_classifier("small_cnn", *pattern_images(30, seed=7, noise=150.0), num_classes=3, epochs=3,
                             lr=1e-2, batch_size=32)
    return data, save_weights(model, root / "small_cnn.safetensors")


def calibrate_pattern_model(files, output, **options):
    """``calibrate()`` of :func:`pattern_model_files` on its val / test splits, with the model's normalisation."""
    from timm_csm.evaluation import calibrate

    data, weights = files
    return calibrate("small_cnn", data, checkpoint=weights, num_classes=3, in_chans=1,
                     data_config={"mean": MEAN, "std": STD}, calibration_split="val", test_split="test",
                     output=output, log=lambda m: None, **options)
