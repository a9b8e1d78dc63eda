"""The docs site covers what it promises: the whole public API, every error, every function of
the frameworks users migrate from, and every command. (``scripts/test`` also builds the site with
``mkdocs build --strict``, so a broken reference or link fails there.)"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import unidist
from unidist import errors
from unidist._base.migration import POINTERS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _read(page: str) -> str:
    return (DOCS / page).read_text()


def _resolve(path: str) -> object:
    """The object of a mkdocstrings identifier such as ``unidist.data.auto_dataloader``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{path} does not resolve")


def test_every_public_name_is_in_the_api_reference() -> None:
    page = _read("reference/api.md")
    documented = [_resolve(path) for path in re.findall(r"^::: ([\w.]+)$", page, re.M)]
    missing = [
        name
        for name in unidist.__all__
        if name != "__version__" and not any(getattr(unidist, name) is obj for obj in documented)
    ]
    assert not missing, f"add '::: <module>.<name>' to docs/reference/api.md for {missing}"
    assert "`unidist.__version__`" in page


def _error_classes() -> list[type[BaseException]]:
    from unidist.testing import ConformanceError

    found = [
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, errors.UnidistError)
    ]
    return [*found, ConformanceError]


def test_every_error_class_is_in_troubleshooting_with_cause_and_fix() -> None:
    page = _read("troubleshooting.md")
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^#{2,3} )", page, re.M | re.S))
    for cls in _error_classes():
        assert cls.__name__ in sections, f"troubleshooting.md has no '### `{cls.__name__}`'"
        body = sections[cls.__name__]
        assert "**Cause:**" in body, cls.__name__
        assert "**Fix:**" in body, cls.__name__


def _migration_rows(page: str, prefix: str) -> dict[str, str]:
    """``{function: unidist equivalent}`` from the table rows ``| `prefix.name` | ... |``."""
    rows = re.findall(rf"^\| `{prefix}\.(\w+)` \| (.*?) \|", _read(page), re.M)
    return dict(rows)


def _check_migration(page: str, prefix: str, module: str, names: set[str]) -> None:
    rows = _migration_rows(page, prefix)
    missing = sorted(names - set(rows))
    assert not missing, f"docs/{page} has no row for {prefix}.{missing}"
    assert all(rows[name].strip() for name in names), "every row names a unidist equivalent"
    # A ported call by the same name never fails with Python's guess: the name is unidist's
    # too, or it has a pointer (tested in test_public_api).
    for name in names:
        if name in unidist.__all__:
            continue
        assert POINTERS.get(name, (None,))[0] == module, f"unidist.{name} needs a pointer"


@pytest.mark.ignite
def test_every_ignite_distributed_function_is_in_the_ignite_migration_page() -> None:
    import ignite.distributed as idist

    names = {
        name for name in dir(idist) if not name.startswith("_") and callable(getattr(idist, name))
    }
    assert {"Parallel", "auto_dataloader", "get_nnodes", "sync"} <= names
    _check_migration("migration/ignite.md", "idist", "ignite.distributed", names)


@pytest.mark.composer
def test_every_composer_dist_function_is_in_the_composer_migration_page() -> None:
    from composer.utils import dist

    names = set(dist.__all__) | {
        name
        for name, value in vars(dist).items()
        if not name.startswith("_")
        and inspect.isfunction(value)
        and value.__module__ == dist.__name__
    }
    assert {"get_global_rank", "get_sampler", "run_local_rank_zero_first"} <= names
    _check_migration("migration/composer.md", "dist", "composer.utils.dist", names)


#: What PyTorch's distributed examples (pytorch/examples: the DDP tutorial series, ddp, minGPT-DDP,
#: FSDP, FSDP2) call in torch.distributed, and the other torch names they use for it.
TORCH_FUNCTIONS = {
    "init_process_group",
    "destroy_process_group",
    "is_initialized",
    "is_available",
    "get_backend",
    "get_rank",
    "get_world_size",
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_object",
    "broadcast_object_list",
    "new_group",
}
TORCH_OTHERS = (
    "`torchrun --nproc-per-node N script.py`",
    "`torchrun --standalone ...`",
    "--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID",
    "--nnodes N --node-rank K --master-addr A --master-port P",
    'int(os.environ["LOCAL_RANK"])',
    "LOCAL_WORLD_SIZE",
    "torch.cuda.set_device(local_rank)",
    "torch.multiprocessing.spawn",
    "torch.utils.data.distributed.DistributedSampler",
    "sampler.set_epoch(epoch)",
    "DistributedDataParallel(model",
    "`model.module`",
    "fully_shard",
    "shuffle=False",
)


def test_every_torch_call_of_pytorchs_examples_is_in_the_torch_migration_page() -> None:
    rows = _migration_rows("migration/torch.md", "dist")
    missing = sorted(TORCH_FUNCTIONS - set(rows))
    assert not missing, f"docs/migration/torch.md has no row for dist.{missing}"
    # Composer's pointers serve the names torch shares with it (is_available, ...).
    pointless = [n for n in TORCH_FUNCTIONS if n not in unidist.__all__ and n not in POINTERS]
    assert not pointless, f"unidist.{pointless} need pointers"
    page = _read("migration/torch.md")
    missing = [usage for usage in TORCH_OTHERS if usage not in page]
    assert not missing, f"docs/migration/torch.md does not mention {missing}"
    import torch.distributed as dist

    assert all(callable(getattr(dist, name)) for name in TORCH_FUNCTIONS)


#: Ignite's flags and lists: pointed at, but not functions, so not rows of the tables.
NOT_FUNCTIONS = {
    "has_native_dist_support",
    "has_xla_support",
    "has_hvd_support",
    "registered_computation_models",
}


def test_the_pointers_name_the_migration_pages_rows() -> None:
    pages = {
        "ignite.distributed": _migration_rows("migration/ignite.md", "idist"),
        "composer.utils.dist": _migration_rows("migration/composer.md", "dist"),
        "torch.distributed": _migration_rows("migration/torch.md", "dist"),
    }
    for name, (module, _) in POINTERS.items():
        rows = pages[module]
        if name in NOT_FUNCTIONS:
            continue
        assert name in rows, f"{module}.{name} has a pointer but no row in its migration page"


def test_the_cli_reference_covers_every_command() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mkdocs_hooks import MARKER, cli_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    text = cli_reference()
    for command in (
        "unidist",
        "unidist config",
        "unidist probe",
        "unidist launch",
        "unidist smoke",
    ):
        assert f"## `{command}`" in text
    assert "--dry-run" in text
    assert MARKER in _read("reference/cli.md")


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = set(re.findall(r":\s+([\w/.-]+\.md)$", config, re.M))
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert nav == pages


def test_the_readme_links_to_the_docs_and_keeps_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "mkdocs serve" in readme
    assert "docs/index.md" in readme
    commands = re.findall(r"^\./scripts/\w+", readme, re.M)
    assert commands == ["./scripts/demo", "./scripts/test"]


def test_the_logged_choices_of_auto_dataloader_are_what_the_output_guide_shows() -> None:
    # The guide's example: 4096 samples, 2 ranks, a global batch of 128, the defaults.
    import torch

    from unidist.data import _describe
    from unidist.samplers import DistributedSampler

    dataset = torch.utils.data.TensorDataset(torch.zeros(4096, 2))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler)
    line = _describe(loader, dataset, 64, 2, [])  # type: ignore[arg-type]
    block = _read("guides/output.md").split("```text\n", 1)[1].split("```", 1)[0]
    shown = " ".join(block.split()).split("unidist.data INFO: ", 1)[1]
    assert shown == line


def _rows(page: str, prefix: str) -> set[str]:
    """The owner's function of every row of a migration page's table (``| `idist.X` |``)."""
    return set(re.findall(rf"(?m)^\| `{prefix}\.(\w+)` \|", _read(page)))


def _cased(cases: dict[str, object]) -> set[str]:
    return {name.split("/")[0] for name in cases}


def test_every_row_of_the_ignite_page_has_a_parity_test() -> None:
    from tests.compat import _cases

    rows = _rows("migration/ignite.md", "idist")
    # Parallel.run calls spawn in both modules: tests/compat/test_ignite_parity.py's
    # test_parallel_spawns_the_same_processes_as_ignites checks the two rows.
    tested = _cased({**_cases.IGNITE, **_cases.IGNITE_ONE_PROCESS}) | {"Parallel", "spawn"}
    assert len(rows) > 25
    assert rows - tested == set(), "rows of docs/migration/ignite.md without a case"


def test_every_row_of_the_composer_page_has_a_parity_test() -> None:
    from tests.compat import _cases

    rows = _rows("migration/composer.md", "dist")
    assert len(rows) > 15
    tested = _cased({**_cases.COMPOSER, **_cases.COMPOSER_UNINITIALIZED})
    assert rows - tested == set(), "rows of docs/migration/composer.md without a case"


@pytest.mark.ignite
def test_the_shims_give_every_name_of_their_owners() -> None:
    import ignite.distributed as idist

    import unidist.compat.composer
    import unidist.compat.ignite

    owners = {
        unidist.compat.ignite: {
            n for n in dir(idist) if not n.startswith("_") and callable(getattr(idist, n))
        },
        unidist.compat.composer: _rows("migration/composer.md", "dist"),
    }
    for shim, names in owners.items():
        missing = sorted(n for n in names if not hasattr(shim, n))
        assert missing == [], f"{shim.__name__} lacks {missing}"


def _owner_table_rows(page: str) -> list[str]:
    """The first cell of every row of a page's ``| torch | unidist | Differences |`` tables."""
    cells: list[str] = []
    inside = False
    for line in _read(page).splitlines():
        if line.startswith("| torch | unidist | Differences |"):
            inside = True
        elif inside and line.startswith("| ") and not line.startswith("| --- "):
            found = re.match(r"\| (.*?) \|", line)
            assert found, line
            cells.append(found.group(1))
        elif not line.startswith("| "):
            inside = False
    return cells


def test_every_row_of_the_torch_page_has_a_parity_test() -> None:
    from tests.compat import _cases
    from tests.compat._torch_rows import TORCH_ROWS

    # The function rows: tests/compat/test_torch_parity.py's cases.
    cased = {name.split("/")[0] for name in {**_cases.TORCH, **_cases.TORCH_REFUSED}}
    tested = cased | {"init_process_group", "destroy_process_group"}
    rows = _rows("migration/torch.md", "dist")
    assert len(rows) > 10
    assert rows - tested == set(), "dist. rows of docs/migration/torch.md without a case"
    # The launcher and data/model rows: tests/compat/_torch_rows.py's tests.
    cells = _owner_table_rows("migration/torch.md")
    assert len(cells) > 20
    assert len(cells) == len(set(cells)), "two rows with the same first cell"
    assert sorted(set(cells) - set(TORCH_ROWS)) == [], "rows without a parity test"
    assert sorted(set(TORCH_ROWS) - set(cells)) == [], "TORCH_ROWS names rows the page lacks"
    for cell, tests in TORCH_ROWS.items():
        assert tests, f"{cell}: no test"
        for node in tests:
            path, _, name = node.partition("::")
            assert name, node
            assert "[" not in name, node
            source = ROOT / path
            assert source.is_file(), f"{cell}: {path} does not exist"
            assert f"def {name}(" in source.read_text(), f"{cell}: {node} does not exist"


#: Dotted names that are not a module or attribute of unidist's on purpose: logger names, the
#: names Ignite and Composer users try (each has a pointer), and a sampler state's format tag.
NOT_OBJECTS = {"unidist.sampler", "unidist.rendezvous"} | {f"unidist.{n}" for n in POINTERS}


def _exists(path: str) -> bool:
    try:
        _resolve(path)
    except (AssertionError, AttributeError):
        return False
    return True


def test_every_unidist_name_the_docs_and_docstrings_give_exists() -> None:
    """A module or object named in full (``unidist.session.lifecycle.initialize``) in the docs,
    the README, CONTRIBUTING or a docstring or comment of the source is there: a move that left
    its old name behind fails here."""
    pattern = re.compile(r"(?<![\w/.-])unidist(?:\.[A-Za-z_]\w*)+")
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS.rglob("*.md")]
    files += sorted((ROOT / "src" / "unidist").rglob("*.py"))
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in set(pattern.findall(path.read_text()))
        if name not in NOT_OBJECTS and not _exists(name)
    )
    assert missing == [], "\n".join(missing)


def _python_block(page: str, needle: str) -> str:
    """The first Python code block of ``docs/<page>`` that contains ``needle``."""
    blocks = re.findall(r"```python\n(.*?)```", _read(page), flags=re.S)
    return next(block for block in blocks if needle in block)


@pytest.mark.multiprocess
@pytest.mark.parametrize("page", ["guides/adapters.md", "guides/testing.md"])
def test_the_check_adapter_snippets_run_as_saved_scripts(page: str, tmp_path: Path) -> None:
    """A reader saves the snippet as a script and runs it: it passes (the guide's placeholder
    adapter is the worked example's)."""
    code = _python_block(page, "check_adapter(").replace(
        "my_package.adapter:MyAdapter", "examples.custom_adapter:CountingAdapter"
    )
    script = tmp_path / "check.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_guides_reference_and_examples_name_only_public_paths() -> None:
    """What a user or an adapter author reads imports and documents public paths only (a
    module whose path has a part starting with ``_`` is unidist's own business)."""
    pattern = re.compile(r"(?<![\w/.-])unidist(?:\.[A-Za-z_]\w*)+")
    pages = [path for path in DOCS.rglob("*.md") if path.name not in ("architecture.md",)]
    files = [*pages, *sorted((ROOT / "examples").glob("*.py"))]
    private = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in set(pattern.findall(path.read_text()))
        if any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
    )
    assert private == [], "\n".join(private)
