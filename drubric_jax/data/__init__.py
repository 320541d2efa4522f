"""Data: the shared JSONL schema, anchor lists, prompt sets and batching (host side).

Pure Python + numpy (METHOD = ../shared/docs/METHOD.md). One job per module:

- `schema`: `Record` rows of the shared JSONL schema (../shared/data/README.md),
  `load_jsonl` (errors name file:line:field), `jsonl_line` (one row written), `write_json` (any JSON file, atomically), `gold_ranks`
  (METHOD 11), and the rows a run reads: `AnchorList` (one anchor example for Eq. 15)
  and `PromptItem` (METHOD 5).
- `filters`: the Appendix B heuristics of METHOD section 9 (`is_repetitive`, ...) and
  its two filters: generator training (`AnchorFilterConfig`, `anchor_drop_reason`) and
  policy training (`PolicyFilterConfig`, `policy_prompt_drop_reason`).
- `sources`: readers from files to rows: `anchor_lists_from_jsonl`,
  `anchor_lists_from_hf` (Nectar, network), `prompts_from_jsonl`, the demo set paths,
  and `anchor_lists_from_records` / `prompts_from_records` (the same rules on Records).
- `tfds_source`: "tfds:NAME[:SPLIT]" data entries, read with `tfds.data_source` (no
  TensorFlow): `records_from_tfds`, the example <-> Record mapping.
- `tfds_build`: `build_tfds`, JSONL files into a TFDS dataset (experiments/build_tfds.py).
- `loading`: a `DataSpec` (what a run config says of its data) -> `LoadedData` (train anchors, held-out anchors, prompts,
  fingerprint): `load_data`; `check_data_sources`, the fast check before weights load.
- `fingerprint`: `data_fingerprint`, paths, row counts and a content hash of the rows
  a run used (to refuse resuming a workdir with other data).
- `iterators`: `shuffled_order`, `host_shard`, `EpochIterator` (deterministic, per-host,
  resumable batching).
- `splits`: the checks world's five disjoint prompt splits (`SPLITS`, `STAGE_SPLITS`) and
  `require_split`, the check that a stage reads only its own (`SplitError`).

Every public name is re-exported here, so `from drubric_jax import data;
data.EpochIterator` works.
"""
from drubric_jax.data.filters import (APPENDIX_B_FILTERS, AnchorFilterConfig,
                                      PolicyFilterConfig, anchor_drop_reason, is_boilerplate,
                                      is_broken_text, is_clarification_only, is_degenerate,
                                      is_greeting_only, is_plain_refusal, is_repetitive,
                                      is_useful, policy_prompt_drop_reason)
from drubric_jax.data.fingerprint import data_fingerprint
from drubric_jax.data.iterators import EpochIterator, host_shard, shuffled_order
from drubric_jax.data.checking import MissingDataFile, check_data_sources
from drubric_jax.data.loading import (DataSpec, LoadedData, load_data,
                                      resolve_data_paths)
from drubric_jax.data.schema import (AnchorList, PathLike, PromptItem, Record,
                                     anchor_from_record, gold_ranks, jsonl_line, write_json,
                                     load_jsonl, load_jsonl_files, record_from_dict)
from drubric_jax.data.sources import (anchor_lists_from_hf, anchor_lists_from_jsonl,
                                      anchor_lists_from_records, demo_anchor_path,
                                      demo_prompt_path, nectar_row_to_anchor,
                                      prompts_from_jsonl, prompts_from_records,
                                      split_hh_transcript)
from drubric_jax.data.splits import (SPLITS, STAGE_NAMES, STAGE_SPLITS, SplitError,
                                     anchor_file, check_disjoint, prompt_file, require_split,
                                     split_of)
from drubric_jax.data.tfds_build import build_tfds, default_split_names, expand_jsonl_entries
from drubric_jax.data.tfds_source import (is_tfds_spec, parse_tfds_spec, record_from_example,
                                          record_to_example, records_from_tfds)
