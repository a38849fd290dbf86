"""SemanticMixingPipeline as a diffusers DiffusionPipeline: save / load, outputs, progress bar, generator, config."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, UniPCMultistepScheduler

from timm_csm.generation import (EDMSemanticMixingPipeline, GENERATOR_PROFILES, SemanticMixingPipeline,
                                 SemanticMixingPipelineOutput, create_class_unet, create_scheduler, plan_groups,
                                 weights_digest)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "timm_csm" / "assets" / "generator-fmnist"
K = 4
NAMES = [f"c{i}" for i in range(K)]
LAMBDAS = [0.0, 0.5, 1.0]


def _tiny_pipeline(**kwargs) -> SemanticMixingPipeline:
    torch.manual_seed(0)
    unet = create_class_unet(GENERATOR_PROFILES["smoke"], K)
    for p in unet.parameters():  # diffusers zero-inits some output layers
        p.data.normal_(0, 0.05)
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2")
    pipe = SemanticMixingPipeline(unet, sched, NAMES, recommended_guidance_scale=1.5,
                                  metadata={"name": "tiny", "dataset": "random", "recipe": {"steps": 0}},
                                  num_inference_steps=3, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_round_trip_through_diffusion_pipeline_gives_identical_images(tmp_path):
    pipe = _tiny_pipeline()
    groups = plan_groups(K, 3, seed_offset=5)
    before = pipe(groups, LAMBDAS).images
    pipe.save_pretrained(tmp_path / "gen")
    index = json.loads((tmp_path / "gen" / "model_index.json").read_text())
    assert index["_class_name"] == "SemanticMixingPipeline"
    assert index["unet"] == ["diffusers", "UNet2DModel"] and index["scheduler"] == ["diffusers", "DDIMScheduler"]
    assert index["class_names"] == NAMES and index["recommended_guidance_scale"] == 1.5
    assert index["metadata"] == {"name": "tiny", "dataset": "random", "recipe": {"steps": 0}}

    loaded = SemanticMixingPipeline.from_pretrained(tmp_path / "gen", num_inference_steps=3)
    assert type(loaded) is SemanticMixingPipeline
    assert loaded.class_names == NAMES and loaded.guidance_scale == 1.5 and loaded.config.metadata["name"] == "tiny"
    loaded.set_progress_bar_config(disable=True)
    assert torch.equal(loaded(groups, LAMBDAS).images, before)
    # the sampling defaults are not configuration: a plain load has diffusers' 50 steps
    assert SemanticMixingPipeline.from_pretrained(tmp_path / "gen").num_inference_steps == 50
    assert loaded.provenance["revision"] == weights_digest(tmp_path / "gen") and pipe.provenance["revision"] == ""


def test_return_dict_and_output_types():
    pipe = _tiny_pipeline(guidance_scale=1.0)
    groups = plan_groups(K, 2)
    out = pipe(groups, LAMBDAS)
    assert isinstance(out, SemanticMixingPipelineOutput)
    assert out.images.dtype == torch.uint8 and out.images.shape == (6, 1, 28, 28)
    assert [(g.group_id, lam) for g, lam in out.members] == [(g, lam) for g in (0, 1) for lam in LAMBDAS]
    images, members = pipe(groups, LAMBDAS, return_dict=False)
    assert torch.equal(images, out.images) and members == out.members
    as_np = pipe(groups, LAMBDAS, output_type="np").images
    assert isinstance(as_np, np.ndarray) and as_np.dtype == np.uint8 and as_np.shape == (6, 28, 28, 1)
    assert np.array_equal(as_np, out.images.permute(0, 2, 3, 1).numpy())
    as_pil = pipe(groups, LAMBDAS, output_type="pil").images
    assert len(as_pil) == 6 and as_pil[0].mode == "L" and as_pil[0].size == (28, 28)
    assert np.array_equal(np.asarray(as_pil[4]), out.images[4, 0].numpy())
    with pytest.raises(ValueError, match="output_type must be one of"):
        pipe(groups, LAMBDAS, output_type="latent")


def test_progress_bar_runs_over_the_steps_and_can_be_disabled(capsys):
    pipe = _tiny_pipeline(guidance_scale=1.0)
    pipe.set_progress_bar_config(disable=False)
    pipe(plan_groups(K, 1), [0.0, 1.0], num_inference_steps=4)
    assert "4/4" in capsys.readouterr().err
    pipe.set_progress_bar_config(disable=True)
    pipe(plan_groups(K, 1), [0.0, 1.0], num_inference_steps=4)
    assert capsys.readouterr().err == ""


def test_generator_seeds_stochastic_steps_and_group_noise_stays_per_group():
    pipe = _tiny_pipeline(guidance_scale=1.0)
    groups = plan_groups(K, 2)
    ddim = pipe(groups, LAMBDAS).images
    assert torch.equal(pipe(groups, LAMBDAS, generator=torch.Generator().manual_seed(3)).images, ddim)  # eta 0
    pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    first = pipe(groups, LAMBDAS, generator=torch.Generator().manual_seed(3)).images
    again = pipe(groups, LAMBDAS, generator=torch.Generator().manual_seed(3)).images
    other = pipe(groups, LAMBDAS, generator=torch.Generator().manual_seed(4)).images
    assert torch.equal(first, again) and not torch.equal(first, other)
    # each group still starts from its own seed's noise: generating group 1 alone changes nothing for it at eta 0
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    assert torch.equal(pipe(groups[1:], LAMBDAS).images, ddim[3:])


def test_scheduler_swap_is_recorded_in_config_and_provenance(tmp_path):
    pipe = _tiny_pipeline()
    assert pipe.provenance["sampler"] == "ddim (eta 0)" and pipe.provenance["guidance_scale"] == 1.5
    pipe.scheduler = create_scheduler("dpm", pipe.scheduler.config)
    assert isinstance(pipe.scheduler, DPMSolverMultistepScheduler) and pipe.provenance["sampler"] == "dpm-solver++"
    pipe.save_pretrained(tmp_path)
    assert isinstance(SemanticMixingPipeline.from_pretrained(tmp_path).scheduler, DPMSolverMultistepScheduler)
    pipe.scheduler = create_scheduler("unipc", pipe.scheduler.config)
    assert isinstance(pipe.scheduler, UniPCMultistepScheduler) and pipe.scheduler.config.beta_schedule == \
        "squaredcos_cap_v2"
    with pytest.raises(ValueError, match="unknown scheduler 'euler'"):
        create_scheduler("euler", pipe.scheduler.config)


def test_a_mixing_config_sets_the_time_steps_and_precision_of_a_generator_folder(tmp_path):
    from timm_csm.generation import MixingConfig, create_generator

    _tiny_pipeline().save_pretrained(tmp_path / "gen")
    leading = create_generator(tmp_path / "gen", MixingConfig(steps=4, guidance_scale=1.0))
    assert leading.scheduler.config.timestep_spacing == "leading" and "timestep_spacing" not in leading.provenance
    pipe = create_generator(tmp_path / "gen", MixingConfig(steps=4, guidance_scale=1.0, scheduler="unipc",
                                                           timestep_spacing="trailing", precision="bfloat16"))
    pipe.scheduler.set_timesteps(4)
    assert isinstance(pipe.scheduler, UniPCMultistepScheduler) and pipe.scheduler.timesteps.tolist()[0] == 999
    assert pipe.precision == "bfloat16"
    assert (pipe.provenance["timestep_spacing"], pipe.provenance["precision"]) == ("trailing", "bfloat16")


def test_autocast_precisions_run_the_network_in_their_dtype_and_are_recorded():
    pipe = _tiny_pipeline(guidance_scale=1.0)
    groups = plan_groups(K, 2)
    full = pipe(groups, LAMBDAS).images
    assert "precision" not in pipe.provenance  # float32 sets keep the provenance they were written with
    seen = []
    hook = pipe.unet.conv_in.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    pipe.set_precision("bfloat16")
    half = pipe(groups, LAMBDAS).images
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16} and pipe.provenance["precision"] == "bfloat16"
    assert half.dtype == torch.uint8 and not torch.equal(half, full)
    assert (half.int() - full.int()).abs().float().mean() < 8  # the same images, to bfloat16's precision
    seen.clear()
    hook = pipe.unet.conv_in.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    pipe.set_precision("float16")
    fp16 = pipe(groups, LAMBDAS).images
    hook.remove()
    assert set(seen) == {torch.float16} and pipe.provenance["precision"] == "float16"
    # float16 keeps 3 more mantissa bits than bfloat16: closer to float32's images
    assert (fp16.int() - full.int()).abs().float().mean() < (half.int() - full.int()).abs().float().mean()
    with pytest.raises(ValueError, match=r"precision must be one of \['float32', 'bfloat16', 'float16'\], got 'fp16'"):
        pipe.set_precision("fp16")


def test_bad_configs_are_refused_with_what_to_fix(tmp_path):
    _tiny_pipeline().save_pretrained(tmp_path / "gen")
    index_path = tmp_path / "gen" / "model_index.json"
    index = json.loads(index_path.read_text())
    index_path.write_text(json.dumps({**index, "class_names": NAMES[:3]}))
    with pytest.raises(ValueError, match=r"class table has 5 rows, which does not fit 3 class names"):
        SemanticMixingPipeline.from_pretrained(tmp_path / "gen")
    pipe = _tiny_pipeline()
    with pytest.raises(ValueError, match="class_names must be a list of strings"):
        SemanticMixingPipeline(pipe.unet, pipe.scheduler, K)
    no_null = SemanticMixingPipeline(pipe.unet, pipe.scheduler, NAMES + ["c4"])  # the null row taken as a class
    with pytest.raises(ValueError, match="guidance .* needs a null-class row"):
        no_null(plan_groups(K, 1), LAMBDAS, guidance_scale=2.0)


def test_shipped_generator_loads_as_a_diffusion_pipeline(tmp_path):
    pipe = SemanticMixingPipeline.from_pretrained(SHIPPED)
    assert type(pipe) is SemanticMixingPipeline and isinstance(pipe.scheduler, DDIMScheduler)
    assert pipe.num_classes == 10 and pipe.class_names[9] == "Ankle boot" and pipe.guidance_scale == 1.5
    prov = pipe.provenance
    # the revision generated datasets and cached stages carry: only the UNet weights file is hashed
    assert prov["revision"] == weights_digest(SHIPPED) == "4981f3280e84"
    assert prov["name"] == "timm-csm-fmnist-ddpm" and prov["dataset"] == "fashion_mnist"
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED, copy)
    index = json.loads((copy / "model_index.json").read_text())
    (copy / "model_index.json").write_text(json.dumps({**index, "recommended_guidance_scale": 1.0}))
    assert weights_digest(copy) == prov["revision"]
    pipe.set_progress_bar_config(disable=True)
    images = pipe(plan_groups(10, 1), [0.0, 1.0], num_inference_steps=2).images
    assert images.shape == (2, 1, 28, 28) and not torch.equal(images[0], images[1])


def test_edm_pipeline_has_the_same_call_and_output():
    pipe = EDMSemanticMixingPipeline(lambda x, s, w: torch.zeros_like(x), 3, (1, 2, 2), num_inference_steps=3)
    out = pipe(plan_groups(3, 1), [0.0, 1.0], num_inference_steps=2, generator=torch.Generator().manual_seed(0))
    assert isinstance(out, SemanticMixingPipelineOutput) and out.images.eq(128).all() and len(out.members) == 2
    as_np, members = pipe(plan_groups(3, 1), [0.0, 1.0], output_type="np", return_dict=False)
    assert as_np.shape == (2, 2, 2, 1) and members == out.members
    with pytest.raises(ValueError, match="without guidance"):
        pipe(plan_groups(3, 1), [0.0, 1.0], guidance_scale=2.0)


def test_reading_generated_data_does_not_import_diffusers():
    code = "import sys, timm_csm.generation.writer; assert 'diffusers' not in sys.modules, 'diffusers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
