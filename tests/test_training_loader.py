"""load_trained_classifier: a finished run's folder gives back its model, evaluation transform and metadata, which
reproduce the run's saved test predictions."""
import pytest
import torch
from safetensors.torch import load_file

from timm_csm.training import run
from timm_csm.training import load_data, load_trained_classifier, resolve_config


def _config(tmp_path):
    return dict(dataset="digits", model="small_cnn", epochs=1, batch_size=32, lr=0.05, hflip=0.0, crop_pad=1,
                max_train_samples=160, max_test_samples=100, val_fraction=0.25, seed=0, progress=False,
                output=str(tmp_path), experiment="run", decay_milestones=[1])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("runs")
    results = run(_config(tmp_path))
    return tmp_path, results


def test_the_loaded_classifier_reproduces_the_saved_test_predictions(finished_run):
    tmp_path, results = finished_run
    folder = tmp_path / "run"
    model, transform, meta = load_trained_classifier(folder)
    assert not model.training
    assert (meta["run_id"], meta["epoch"]) == (results["run_id"], results["checkpoint_epoch"])
    test = load_data(resolve_config(_config(tmp_path))).test
    with torch.no_grad():
        logits = model(transform.apply(torch.as_tensor(test.images)))
    saved = load_file(str(folder / "test_predictions.safetensors"))
    assert torch.equal(saved["targets"], torch.as_tensor(test.labels))
    torch.testing.assert_close(logits, saved["logits"], rtol=0, atol=1e-5)
    same, _, _ = load_trained_classifier(folder / "last.safetensors")  # a training state works too
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), model.state_dict().values()))


def test_a_folder_without_a_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_best.safetensors"):
        load_trained_classifier(tmp_path)
    weights = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(weights))
    with pytest.raises(ValueError, match="carries no timm-csm run metadata"):
        load_trained_classifier(weights)
