#!/usr/bin/env python3
"""Train a timm classifier with a calibration loss and evaluate its calibration.

    python train.py --dataset fashion_mnist --model small_cnn --loss ce --epochs 5 -b 128 --lr 0.05
    accelerate launch train.py --model swin_tiny --dataset cifar10 --loss csm --csm-dataset org/csm-cifar10-aug

The same as `timm-csm-train` and `accelerate launch -m timm_csm.commands.train` after an install; `python train.py
--help` lists the options (grouped); see timm_csm/commands/train.py and the run it calls, timm_csm/training/train.py.
"""
import sys

from timm_csm.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
