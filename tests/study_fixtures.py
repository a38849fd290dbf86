"""The tiny study the engine's tests run: scikit-learn's digits, a 2-stage small_cnn on the smoke recipe, one
epoch, CE at tuning seed 0 and decision seeds 0 and 1; each test adds its data budget, searched method and
settings (:func:`tiny_spec`)."""

_MODEL_AND_SEEDS = """\
[model]
name = "small_cnn"
recipe = "smoke"

[model.options]
model_kwargs = { widths = [8, 16] }
batch_size = 16
max_test_samples = 64
bootstrap = 0
reliability_diagrams = false

[seeds]
tuning = [0]
decision = [0, 1]

[methods.ce]
"""


def tiny_spec(name: str, train_size: int, search: str, extra: str = "") -> str:
    """A spec's text: the study ``name`` on ``train_size`` training and 48 validation images of digits, the shared
    model and seeds, the ``[search]`` table's body ``search``, CE as the other method, then ``extra``."""
    return (f'[study]\nname = "{name}"\nsettings = ["matched"]\n\n[data]\ndataset = "digits"\n'
            f"train_size = {train_size}\nval_size = 48\n\n{_MODEL_AND_SEEDS}\n[search]\n{search}\n"
            f'[decision]\nothers = ["ce"]\n{extra}')
