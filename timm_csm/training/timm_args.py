"""Reading the ``args.yaml`` that timm's ``train.py`` writes per run: which of its keys are options of ours (same
name and meaning, or a mapping: ``input_size``, ``clip_grad: null``, ``dataset`` / ``data_dir``), and which are not
(named in one warning by :func:`~timm_csm.training.args.parse_args`)."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

__all__ = ["TIMM_TRAIN_KEYS", "TIMM_SHARED_KEYS", "from_timm_args"]

#: the options of timm's train.py (timm 1.0), the keys of the args.yaml it writes per run
TIMM_TRAIN_KEYS = frozenset("""
    data data_dir dataset train_split val_split train_num_samples val_num_samples dataset_download class_map
    input_img_mode input_key target_key dataset_trust_remote_code model pretrained pretrained_path
    initial_checkpoint resume no_resume_opt num_classes gp img_size in_chans input_size crop_pct mean std
    interpolation batch_size validation_batch_size channels_last fuser grad_accum_steps grad_checkpointing
    fast_norm model_kwargs head_init_scale head_init_bias torchcompile_mode torchscript torchcompile device amp
    amp_dtype amp_impl model_dtype no_ddp_bb synchronize_step local_rank device_modules opt opt_eps opt_betas
    momentum weight_decay clip_grad clip_mode layer_decay layer_decay_min_scale layer_decay_no_opt_scale opt_kwargs
    sched sched_on_updates lr lr_base lr_base_size lr_base_scale lr_noise lr_noise_pct lr_noise_std lr_cycle_mul
    lr_cycle_decay lr_cycle_limit lr_k_decay warmup_lr min_lr epochs epoch_repeats start_epoch decay_milestones
    decay_epochs warmup_epochs warmup_prefix cooldown_epochs patience_epochs decay_rate no_aug train_crop_mode
    scale ratio hflip vflip color_jitter color_jitter_prob grayscale_prob gaussian_blur_prob aa aug_repeats
    aug_splits jsd_loss bce_loss bce_sum bce_target_thresh bce_pos_weight reprob remode recount resplit mixup
    cutmix cutmix_minmax mixup_prob mixup_switch_prob mixup_mode mixup_off_epoch smoothing train_interpolation
    drop drop_connect drop_path drop_block bn_momentum bn_eps sync_bn dist_bn split_bn model_ema
    model_ema_force_cpu model_ema_decay model_ema_warmup seed worker_seeding log_interval recovery_interval
    checkpoint_hist workers save_images pin_mem no_prefetcher output experiment eval_metric tta
    use_multi_epochs_loader log_wandb wandb_project wandb_tags wandb_resume_id apex_amp native_amp
    naflex_loader naflex_train_seq_lens naflex_max_seq_len naflex_loss_scale prefetcher distributed world_size rank
""".split())
#: timm options taken as they are (same name, same meaning)
TIMM_SHARED_KEYS = frozenset("""
    train_split model pretrained pretrained_path initial_checkpoint num_classes img_size in_chans mean std
    batch_size validation_batch_size opt momentum weight_decay clip_mode sched lr warmup_lr min_lr epochs
    decay_milestones decay_epochs warmup_epochs decay_rate hflip mixup mixup_mode smoothing drop drop_path
    model_kwargs seed workers pin_mem amp amp_dtype output experiment
    sync_bn model_ema model_ema_decay model_ema_warmup grad_accum_steps channels_last torchcompile torchcompile_mode
    log_wandb
    scale ratio vflip color_jitter aa reprob remode recount interpolation train_interpolation crop_pct no_aug
    cutmix cutmix_minmax mixup_prob mixup_switch_prob
""".split())


def _timm_dataset(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Our dataset options for timm's ``dataset`` / ``data_dir``: ``hfds/NAME`` is the Hugging Face dataset NAME,
    ``torch/cifar10`` etc. that torchvision dataset in ``data_dir``, an empty name the folder ``data_dir``. timm evaluates on its
    ``val_split``, so that split is the test split here (torchvision datasets: their test set, detected)."""
    name, folder = str(cfg.get("dataset") or ""), cfg.get("data_dir") or cfg.get("data")
    prefix, _, rest = name.partition("/")
    out: Dict[str, Any] = {}
    if prefix.lower() in ("hfds", "hfids") and rest:
        out["dataset"] = rest
    elif prefix.lower() == "torch" and rest:  # torchvision's files in data_dir, read through timm
        out["dataset"] = f"torch/{rest.lower()}"
        if folder:
            out["data_dir"] = str(folder)
    elif name:
        out["dataset"] = name
    elif folder:
        out["dataset"] = str(folder)
    if cfg.get("val_split") and prefix.lower() != "torch":
        out["test_split"] = cfg["val_split"]
    return out


def from_timm_args(cfg: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """(our options, timm keys not taken) for the options of a timm train.py args.yaml.

    Options of the same name and meaning are taken as they are (an empty string is timm's "not set");
    ``input_size`` (C, H, W) gives ``in_chans`` and ``img_size``; ``clip_grad: null`` (timm: no clipping) is
    ``clip_grad: 0``; the dataset as :func:`_timm_dataset`. ``resume`` (a timm checkpoint) and ``checkpoint_hist``
    (timm keeps the N best checkpoints, here the N most recent) are not taken. Keys that are not timm's are kept
    as options of ours (an unknown one is then an error)."""
    out = _timm_dataset(cfg)
    taken = {"dataset", "data_dir", "data", "val_split"}
    for key in sorted(TIMM_SHARED_KEYS & set(cfg)):
        taken.add(key)
        if cfg[key] != "":
            out[key] = cfg[key]
    if "clip_grad" in cfg:
        out["clip_grad"] = 0.0 if cfg["clip_grad"] is None else cfg["clip_grad"]
    size = cfg.get("input_size")
    if size:
        if len(size) != 3 or size[1] != size[2]:
            raise ValueError(f"timm input_size {size}: only square (C, H, H) inputs are supported")
        out.setdefault("in_chans", int(size[0]))
        out["img_size"] = out.get("img_size") or int(size[1])
    taken |= {"clip_grad", "input_size"}
    out.update({k: v for k, v in cfg.items() if k not in TIMM_TRAIN_KEYS})  # ours, or typos: checked as ours
    return out, [k for k in cfg if k in TIMM_TRAIN_KEYS and k not in taken]
