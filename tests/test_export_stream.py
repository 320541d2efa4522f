"""The Hugging Face export written leaf by leaf (`models.export`): on the 8 fake devices of
tests/conftest.py, with params sharded over a (data, fsdp, tensor) mesh, the file is the
one `safetensors.numpy.save_file` writes from the whole host tree (what the exporter wrote
before it streamed, byte for byte), and the host holds at most one fetched piece (a
top-level leaf or one layer of a stacked leaf) at a time.
"""
import json
import os
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from drubric_jax import models, parallel
from drubric_jax.models import export, registry
from drubric_jax.models.config import PRESETS


def _reference_dir(params, cfg, directory):
    """The exporter before streaming: the whole tree on the host, then `save_file`."""
    from safetensors.numpy import save_file

    fam = registry.family(cfg)
    host = jax.device_get(params)
    tensors = {}
    for key in fam.top_keys(cfg):
        w = np.asarray(host[key])
        tensors[fam.TOP_WEIGHT_NAMES[key][0]] = w.T if key in fam.TRANSPOSED else w
    for key in fam.layer_keys(cfg):
        for i in range(cfg.num_layers):
            w = np.asarray(host["layers"][key][i])
            name = f"model.layers.{i}.{fam.LAYER_WEIGHT_NAMES[key][0]}"
            tensors[name] = w.T if key in fam.TRANSPOSED else w
    os.makedirs(directory)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(export.hf_config_dict(cfg, 1, 2), f, indent=2)


def _sharded(cfg, mixed: bool):
    """cfg's random params on a (2, 2, 2) mesh of the 8 fake devices; mixed: the norms in
    float32 and the matrices in bfloat16 (two dtypes, so the file's dtype order counts)."""
    params = registry.init_params(cfg, jax.random.PRNGKey(3))
    if mixed:
        params = jax.tree_util.tree_map_with_path(
            lambda path, x: x.astype(jnp.float32 if "norm" in jax.tree_util.keystr(path)
                                     else jnp.bfloat16), params)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    return jax.device_put(params, models.param_shardings(params, mesh))


@pytest.mark.parametrize("name,mixed", [("tiny", False), ("tiny_qwen3", True),
                                        ("tiny_llama31", True)])
def test_streamed_export_is_byte_identical_to_save_file(name, mixed, tmp_path):
    cfg = PRESETS[name]
    params = _sharded(cfg, mixed)
    assert len(jax.tree.leaves(params)[0].sharding.device_set) == 8
    models.export_hf_dir(params, cfg, str(tmp_path / "new"))
    _reference_dir(params, cfg, str(tmp_path / "old"))
    for f in ("model.safetensors", "config.json"):
        assert (tmp_path / "new" / f).read_bytes() == (tmp_path / "old" / f).read_bytes(), f
    _, back = models.load_hf_dir(str(tmp_path / "new"), dtype=cfg.dtype)
    for a, b in zip(jax.tree.leaves(jax.device_get(params)), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_export_holds_one_fetched_piece_at_a_time(tmp_path, monkeypatch):
    """Every fetch is of one array (never a tree): a top-level leaf, or one layer of a
    stacked [L, ...] leaf; the bytes of fetched pieces alive at once (tracked by a weak
    reference on each returned array, which a view such as a transpose keeps alive) never
    exceed the largest piece, so a stacked leaf is never on the host whole."""
    cfg = PRESETS["tiny_qwen3"]
    params = _sharded(cfg, mixed=False)
    top = [params[k] for k in params if k != "layers"]
    stacked = jax.tree.leaves(params["layers"])
    live, peak, calls = [0], [0], []
    fetch = parallel.fetch_on_first

    def counting(x):
        assert isinstance(x, jax.Array), type(x)  # one array per call
        out = fetch(x)
        calls.append(out.nbytes)
        live[0] += out.nbytes
        peak[0] = max(peak[0], live[0])
        weakref.finalize(out, lambda n=out.nbytes: live.__setitem__(0, live[0] - n))
        return out

    monkeypatch.setattr(parallel, "fetch_on_first", counting)
    models.export_hf_dir(params, cfg, str(tmp_path))
    # Each top leaf whole, each stacked leaf as L layer pieces: never a stacked leaf whole.
    pieces = [x.nbytes for x in top] + [x.nbytes // cfg.num_layers for x in stacked
                                        for _ in range(cfg.num_layers)]
    assert sorted(calls) == sorted(pieces)
    assert sum(calls) == sum(x.nbytes for x in jax.tree.leaves(params))  # every byte once
    assert peak[0] == max(pieces), (peak[0], sorted(calls))
    assert live[0] == 0


def test_layer_slice_is_cut_on_the_devices():
    """`export.layer_slice` of a stacked leaf sharded over (fsdp, tensor) on 8 devices: the
    compiled slice has no collective, the slice keeps the leaf's spec minus the layer axis,
    and its value is the host slice."""
    params = _sharded(PRESETS["tiny_qwen3"], mixed=True)
    w = params["layers"]["w_up"]
    piece = export.layer_slice(w, 1)
    assert piece.sharding.spec == jax.sharding.PartitionSpec(*tuple(w.sharding.spec)[1:])
    np.testing.assert_array_equal(np.asarray(piece, np.float32),
                                  np.asarray(jax.device_get(w)[1], np.float32))
    hlo = export._slice_program(piece.sharding).lower(w, np.int32(1)).compile().as_text()
    for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
        assert op not in hlo, op
    np.testing.assert_array_equal(export.layer_slice(np.arange(6).reshape(3, 2), 2), [4, 5])


def test_safetensors_layout_refuses_what_it_cannot_match():
    with pytest.raises(ValueError, match="complex64"):
        export.safetensors_layout({"a": ("complex64", (2,))}, {})
    with pytest.raises(ValueError, match="one metadata entry"):
        export.safetensors_layout({"a": ("float32", (2,))}, {"a": "1", "b": "2"})


def test_fetch_on_first_one_process_is_fetch():
    params = _sharded(PRESETS["tiny"], mixed=True)
    for x in jax.tree.leaves(params):
        np.testing.assert_array_equal(parallel.fetch_on_first(x), parallel.fetch(x))
