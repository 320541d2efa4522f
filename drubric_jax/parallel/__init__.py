"""Parallelism: the device mesh and shardings (`mesh`), and host rows crossing to and from
the devices under several processes (`rows`). The public names of both are exported here.
"""
from drubric_jax.parallel.mesh import (BATCH_AXES, MESH_AXES, axis_sizes, batch_sharding,
                                       constrain_rows, row_groups, rows_on,
                                       decode_rules, fetch, fetch_on_first, leaf_name,
                                       leaf_sharder, make_mesh, param_shardings, put,
                                       put_rows, replicated, row_shards, spec_for)
from drubric_jax.parallel.rows import (agree_max, fetch_process_rows, gather_ragged,
                                       gather_rows, gather_texts, process_block, process_rows,
                                       process_share, put_process_rows, row_span)
