"""The parity tests of docs/migration/torch.md's launcher and data/model rows.

Each key is the first cell of a row of the page's "Launching and the environment" and "Data and
models" tables, exactly as written there; each value names the tests (pytest node ids without a
parameter suffix) that run torch's or torchrun's spelling and unidist's on the same inputs and
compare what they give. tests/test_docs.py checks that the keys are the page's rows and that
every test exists. The function rows (``dist.X``) are tests/compat/_cases.py's instead.
"""

from __future__ import annotations

__all__ = ["TORCH_ROWS"]

_ROWS = "tests/compat/test_torch_rows.py::"
_CONTRACT = "tests/launch/test_torchrun_contract.py::"
_OPTIONS = "tests/launch/test_options.py::"
_TUTORIAL = "tests/test_examples.py::test_the_ddp_tutorial_gives_plain_torchs_results_bit_for_bit"
_TOPOLOGY = _ROWS + "test_standalone_gives_torchruns_ranks"
_EVERY_OPTION = _OPTIONS + "test_every_torchrun_option_is_accepted_or_refused_with_the_equivalent"

TORCH_ROWS: dict[str, list[str]] = {
    # -- Launching and the environment
    "`torchrun --nproc-per-node N script.py`": [
        _ROWS + "test_nproc_per_node_starts_torchruns_ranks",
        _CONTRACT + "test_the_ranks_get_torchruns_variables_with_its_values",
        _OPTIONS + "test_nproc_per_node_auto_means_what_torchrun_means",
        _TUTORIAL,
    ],
    "`torchrun --standalone ...`": [
        _ROWS + "test_standalone_gives_torchruns_ranks",
        _CONTRACT + "test_the_ranks_get_torchruns_variables_with_its_values",
    ],
    "`torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID`": [
        _ROWS + "test_the_c10d_rendezvous_options_give_torchruns_ranks",
        _ROWS + "test_a_rdzv_conf_key_torch_would_ignore_is_refused_before_anything_starts",
    ],
    "`torchrun --nnodes N --node-rank K --master-addr A --master-port P`": [
        _ROWS + "test_the_static_rendezvous_options_give_torchruns_ranks",
        _CONTRACT + "test_master_port_from_torchrun_gives_the_same_master_addr",
    ],
    "`--max-restarts`, `--monitor-interval`, `--role`, `--start-method`, `--log-dir`, `-r`, "
    "`-t`, `--local-ranks-filter`, `--log-line-prefix-template`, `-m`, `--no-python`, "
    "`--run-path`": [
        _ROWS + "test_torchruns_agent_options_give_the_same_ranks",
        _ROWS + "test_torchruns_output_options_show_and_log_what_torchrun_does",
        _ROWS + "test_torchruns_program_options_run_the_same_program",
        _EVERY_OPTION,
    ],
    "`--logs-specs NAME`": [_ROWS + "test_logs_specs_takes_the_entry_point_torchrun_takes"],
    "`--signals-to-handle`, `--event-log-handler`, `--virtual-local-rank`, "
    "`--numa-binding` (newer torchrun)": [
        _ROWS + "test_the_newer_torchrun_options_work_where_the_installed_torchrun_has_them",
        _ROWS + "test_numa_binding_does_what_the_installed_torchrun_does",
        _EVERY_OPTION,
        "tests/launch/test_edges.py::test_a_newer_pet_variable_is_read_where_this_torch_reads_it",
    ],
    "`--shutdown-timeout S` (newer torchrun)": [
        _ROWS + "test_shutdown_timeout_is_taken_on_every_torch",
        _EVERY_OPTION,
    ],
    "`--duplicate-stdout-filters`, `--duplicate-stderr-filters`, `--print-completion`": [
        _ROWS + "test_torchrun_options_unidist_refuses_name_what_to_use",
        _EVERY_OPTION,
    ],
    "`PET_*` and `TORCHELASTIC_*` variables (`TORCHELASTIC_ENABLE_FILE_TIMER`, `_TIMER_FILE`, "
    "`_HEALTH_CHECK_PORT`, `_UNINTERRUPTIBLE_STATE_TIMEOUT`, `_LOG_LINE_PREFIX_TEMPLATE`)": [
        _ROWS + "test_pet_variables_are_read_as_torchrun_reads_them",
        _ROWS + "test_torchelastic_variables_are_read_as_torchrun_reads_them",
        _ROWS + "test_a_variable_torch_would_ignore_or_fail_on_later_is_refused_first",
    ],
    '`int(os.environ["LOCAL_RANK"])`': [_TOPOLOGY],
    '`int(os.environ["RANK"])`, `os.environ["WORLD_SIZE"]`': [_TOPOLOGY],
    '`os.environ["LOCAL_WORLD_SIZE"]`, `GROUP_RANK`': [_TOPOLOGY],
    "`argparse`'s `--local_rank` (from the old `torch.distributed.launch`)": [
        _TOPOLOGY,
        _ROWS + "test_the_c10d_rendezvous_options_give_torchruns_ranks",
        _ROWS + "test_the_static_rendezvous_options_give_torchruns_ranks",
    ],
    "`torch.cuda.set_device(local_rank)`, `torch.accelerator.set_device_index`": [_TOPOLOGY],
    "`dist.get_default_backend_for_device(...)`": [
        _ROWS + "test_the_backend_is_torchs_default_for_the_visible_device"
    ],
    "`torch.multiprocessing.spawn(fn, args=(...), nprocs=N)` with `MASTER_ADDR`/`MASTER_PORT` "
    "set by hand": [
        _ROWS + "test_spawn_runs_what_torch_multiprocessing_spawn_runs",
        _ROWS + "test_spawn_names_the_rank_that_failed_as_torchs_does",
    ],
    # -- Data and models
    "`torch.utils.data.distributed.DistributedSampler(ds, num_replicas, rank, shuffle, seed, "
    "drop_last)`": [
        _ROWS + "test_distributed_sampler_gives_torchs_indices",
        "tests/test_borrowed_samplers.py::"
        "test_distributed_sampler_renamed_from_torch_gives_torch_indices",
        "tests/test_samplers.py::test_torch_order_matches_torch_index_for_index",
        "tests/test_samplers_wrapper.py::test_native_torch_sampler_matches_torch_order",
    ],
    "`sampler.set_epoch(epoch)`": [
        _ROWS + "test_set_epoch_gives_torchs_orders",
        "tests/test_samplers.py::test_without_set_epoch_every_iteration_repeats_the_epoch_as_in_torch",
        "tests/test_borrowed_samplers.py::"
        "test_distributed_sampler_renamed_from_torch_gives_torch_indices",
    ],
    "`DataLoader(ds, batch_size=B, sampler=DistributedSampler(ds))`": [
        _ROWS + "test_a_dataloader_over_unidists_sampler_or_auto_dataloader_gives_torchs_batches",
        _TUTORIAL,
    ],
    "`DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])`": [
        _ROWS + "test_auto_model_trains_as_distributed_data_parallel",
        _TUTORIAL,
    ],
    "`model.module`": [_ROWS + "test_unwrap_model_gives_what_module_gives", _TUTORIAL],
    "`FullyShardedDataParallel(model, ...)`, `fully_shard(layer)`": [
        _ROWS + "test_auto_model_shards_as_fsdp_and_fully_shard"
    ],
}
