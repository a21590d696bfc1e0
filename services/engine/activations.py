"""Activations by the names configs give them (``hidden_act``), for MLPs and experts alike."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "relu2": lambda x: torch.square(F.relu(x))}
