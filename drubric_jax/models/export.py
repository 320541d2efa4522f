"""Writing params as a Hugging Face directory (config.json + model.safetensors) that
transformers loads (`LlamaForCausalLM`, `Qwen3ForCausalLM`, ...) and `models.weights.load_hf_dir`
loads back bit for bit. The config.json fields and the checkpoint tensor names come from the
model family's module, the model type from the registry (`registry.to_hf_model_type`).
"""
from __future__ import annotations

import json
import os
import tempfile

import jax
import numpy as np
from etils import epath

from drubric_jax import parallel
from drubric_jax.models import registry
from drubric_jax.models.config import ModelConfig


def hf_config_dict(cfg: ModelConfig, bos_id: int, eos_id: int) -> dict:
    """A `config.json` dict that transformers reads as the class of `cfg`'s family or alias
    (`registry.to_hf_model_type`; e.g. LlamaForCausalLM, Qwen3ForCausalLM), with the
    family's fields (`config_to_hf` of the family module) and the token ids.

    Raises:
        NotImplementedError: a family without export (`qwen3_moe`).
    """
    fields = registry.family(cfg).config_to_hf(cfg, bos_id, eos_id)
    model_type, architecture = registry.to_hf_model_type(cfg)
    return {"architectures": [architecture], "model_type": model_type, **fields}


def export_hf_dir(params: dict, cfg: ModelConfig, directory: str, tokenizer=None,
                  bos_id: int = 1, eos_id: int = 2) -> None:
    """Writes params as a Hugging Face directory: config.json, model.safetensors and,
    when `tokenizer` (a PreTrainedTokenizerFast) is given, its tokenizer files.

    Weights keep their dtype; `load_hf_dir(export_hf_dir(p))` reproduces p exactly.
    Under several processes every process must call it (each leaf is gathered to the host
    in turn, a collective); only process 0 keeps the host copies and writes the files.
    `directory` is a local path or a URL (gs://bucket/run/export/policy): a URL's files are
    written to a local temporary directory first (safetensors and the tokenizer write
    local files) and then copied there with `etils.epath`.

    Raises:
        NotImplementedError: a family without export (`qwen3_moe`: only trainees are
            exported, and it is the frozen verifier), before any leaf is gathered.
    """
    from safetensors.numpy import save_file

    config_json = hf_config_dict(cfg, bos_id, eos_id)

    writer = jax.process_index() == 0
    tensors = {}
    fam = registry.family(cfg)
    for key in fam.top_keys(cfg):
        w = parallel.fetch(params[key])  # one leaf at a time on the host
        if writer:  # checkpoints store linear weights [out, in]; ours are [in, out]
            tensors[fam.TOP_WEIGHT_NAMES[key][0]] = w.T if key in fam.TRANSPOSED else w
    for key in fam.layer_keys(cfg):
        stacked = parallel.fetch(params["layers"][key])
        if not writer:
            continue
        # Hugging Face names one tensor per layer: the stacked [L, ...] leaf is split.
        for i in range(cfg.num_layers):
            w = stacked[i]
            name = f"model.layers.{i}.{fam.LAYER_WEIGHT_NAMES[key][0]}"
            tensors[name] = w.T if key in fam.TRANSPOSED else w
    if not writer:
        return

    def write(local: str) -> None:
        os.makedirs(local, exist_ok=True)
        # metadata "pt": the format tag transformers checks before it loads a safetensors file.
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
                  os.path.join(local, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(local, "config.json"), "w") as f:
            json.dump(config_json, f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(local)

    if "://" not in str(directory):
        write(str(directory))
        return
    # os.makedirs("gs://b/x") would make a local "gs:" folder and the export would be lost.
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        dest = epath.Path(directory)
        dest.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(tmp)):
            epath.Path(tmp, name).copy(dest / name, overwrite=True)
