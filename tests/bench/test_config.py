"""Grid files: parsing, validation with clear errors, overrides and the cell expansion."""

from __future__ import annotations

import pytest

import dyntta
from dyntta.bench.config import load_grid
from dyntta.methods import available_methods, method_class
from tests.bench.helpers import GRID_TOML
from tests.conftest import tiny_resnet


@pytest.fixture
def grid_file(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID_TOML)
    return path


def test_cells_are_the_product_of_the_axes_with_stable_unique_keys(grid_file):
    grid = load_grid(grid_file)
    cells = grid.cells()
    assert len(cells) == 1 * 2 * 1 * 3 * 2  # datasets x scenarios x batch x methods x seeds
    assert len({c.key for c in cells}) == len(cells)
    assert [c.key for c in load_grid(grid_file).cells()] == [c.key for c in cells]


def test_a_recipe_enters_the_key_and_no_recipe_leaves_it_as_without_the_field(grid_file):
    """Records written before datasets had a recipe keep their keys (a re-run resumes them)."""
    plain = load_grid(grid_file).cells()[0]
    given = load_grid(grid_file, ['datasets=[{name = "npz", path = "x.npz", recipe = "cifar"}]'])
    npz = load_grid(grid_file, ['datasets=[{name = "npz", path = "x.npz"}]']).cells()[0]
    assert "recipe" not in plain.to_dict()["dataset"]
    assert given.cells()[0].to_dict()["dataset"]["recipe"] == "cifar"
    assert given.cells()[0].key != npz.key


def test_wild_cells_expand_over_deltas_and_others_do_not(grid_file):
    grid = load_grid(grid_file, ['stream.scenarios=["wild", "crossmix"]',
                                 "stream.deltas=[0.1, 0.01]"])
    deltas = sorted((c.scenario, c.delta) for c in grid.cells() if c.method == "dyn" and c.seed == 0)
    assert deltas == [("crossmix", None), ("wild", 0.01), ("wild", 0.1)]


def test_overrides_replace_fields_and_options_reach_the_cells(grid_file):
    grid = load_grid(grid_file, ["stream.batch_sizes=[1, 256]", "options.dyn.alpha=0.6",
                                 "seeds=[3]"])
    assert grid.batch_sizes == (1, 256) and grid.seeds == (3,)
    assert {c.options for c in grid.cells() if c.method == "dyn"} == {(("alpha", 0.6),)}


def test_a_datasets_options_reach_its_cells_over_the_grids_and_key_as_if_set_for_all(grid_file):
    """A dataset's method options override the grid's for that dataset's cells only, and a cell
    has the key it would have with the same options set for the whole grid (records made either
    way resume each other)."""
    two = ('datasets=[{name = "digits", options = {dyn = {alpha = 0.5}}}, '
           '{name = "npz", path = "x.npz"}]')
    grid = load_grid(grid_file, [two, "options.dyn.alpha=0.6", "options.dyn.mix=\"std\""])
    dyn = {c.dataset.name: dict(c.options) for c in grid.cells() if c.method == "dyn"}
    assert dyn == {"digits": {"alpha": 0.5, "mix": "std"}, "npz": {"alpha": 0.6, "mix": "std"}}
    assert {c.options for c in grid.cells() if c.method == "tbn"} == {()}
    own = [c for c in grid.cells() if c.dataset.name == "digits"]
    everywhere = load_grid(grid_file, ["options.dyn.alpha=0.5", "options.dyn.mix=\"std\""])
    assert [c.key for c in own] == [c.key for c in everywhere.cells()]
    assert "options" not in own[0].to_dict()["dataset"]
    # a list (TOML's array) is a tuple in the entry, which stays hashable; the key is the same
    listed = load_grid(grid_file, ['methods=["sar"]',
                                   'datasets=[{name = "digits", options = {sar = {frozen = ["fc"]}}}]'])
    everywhere = load_grid(grid_file, ['methods=["sar"]', 'options.sar.frozen=["fc"]'])
    assert len({c.dataset for c in listed.cells()}) == 1
    assert [c.key for c in listed.cells()] == [c.key for c in everywhere.cells()]


@pytest.mark.parametrize("entry, message", [
    ('{name = "digits", options = {magic = {}}}', r"datasets\[0\]: options: unknown key\(s\) "
                                                  r"\['magic'\]"),
    ('{name = "digits", options = {dyn = {beta = 1}}}',
     r"datasets\[0\]: options.dyn: unknown key\(s\) \['beta'\]"),
    ('{name = "digits", options = {dyn = {alpha = 2.0}}}', r"alpha must lie in \[0, 1\]"),
    ('{name = "digits", options = 3}', r"datasets\[0\]: options: expected a table"),
    ('{name = "digits"}, {name = "digits", options = {dyn = {alpha = 0.5}}}',
     r"datasets\[1\]: repeats datasets\[0\] \(one entry per dataset and model"),
])
def test_bad_dataset_options_are_errors_naming_the_entry(grid_file, entry, message):
    with pytest.raises(ValueError, match=message):
        load_grid(grid_file, [f"datasets=[{entry}]"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("colour=1", r"unknown key\(s\) \['colour'\]"),
        ("stream.speed=1", r"grid.toml: \[stream\]: unknown key\(s\) \['speed'\]"),
        ('methods=["dyn", "magic"]', "methods: unknown method 'magic'; available"),
        ('stream.scenarios=["chaos"]', "stream.scenarios: unknown value 'chaos'; valid: continual"),
        ("stream.batch_sizes=[0]", "stream.batch_sizes must be a non-empty list of integers >= 1"),
        ("options.dyn.beta=1", r"\[options.dyn\]: unknown key\(s\) \['beta'\]"),
        ("options.dyn.alpha=2.0", r"alpha must lie in \[0, 1\]"),
        ('columns=["colour"]', "columns: unknown value 'colour'"),
        ("datasets=[]", r"at least one \[\[datasets\]\]"),
        ("stream.severity=6", "stream.severity must be one integer in 1..5"),
        ("stream.n_samples=0", r'n_samples \(dataset rows per domain\) must be an int >= 1'),
        ('stream.n_samples="some"', r'n_samples \(dataset rows per domain\) must be an int'),
        ("nonsense", "must look like key=value"),
    ],
)
def test_bad_grids_are_errors_naming_the_problem(grid_file, override, message):
    with pytest.raises(ValueError, match=message):
        load_grid(grid_file, [override])


def test_n_samples_all_means_every_row_and_later_overrides_win(grid_file):
    assert load_grid(grid_file, ['stream.n_samples="all"']).n_samples is None
    assert load_grid(grid_file, ['stream.n_samples="all"', "stream.n_samples=7"]).n_samples == 7


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="grid file not found"):
        load_grid(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("title = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_grid(tmp_path / "bad.toml")
    (tmp_path / "ds.toml").write_text('[[datasets]]\npath = "x"\n')
    with pytest.raises(ValueError, match="'name' is required"):
        load_grid(tmp_path / "ds.toml")


def test_checked_in_paper_grids_parse():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))
    assert configs, "configs/ holds the paper's grids"
    for path in configs:
        assert load_grid(path).cells()


PUBLISHED_METHODS = [m for m in available_methods()
                     if getattr(method_class(m).Config, "PUBLISHED", None)]


def test_some_baselines_have_published_settings():
    assert {"tent", "eata", "sar", "deyo"} <= set(PUBLISHED_METHODS)


DATASET_OF = {"cifar10": "cifar10-c", "cifar100": "cifar100-c", "imagenet": "imagenet-c"}


@pytest.mark.parametrize("method, family", [(m, f) for m in PUBLISHED_METHODS
                                            for f in method_class(m).Config.PUBLISHED])
def test_the_protocol_reaches_each_methods_config(grid_file, method, family):
    published = method_class(method).Config.PUBLISHED[family]
    name = DATASET_OF[family]
    overrides = [f'methods=["{method}"]', f'datasets=[{{name = "{name}"}}]']
    grid = load_grid(grid_file, [*overrides, 'protocol="published"'])
    cell = grid.cells()[0]
    assert cell.protocol == "published" and dict(cell.options) == published
    config = dyntta.adapt(tiny_resnet(), method, **dict(cell.options)).config
    assert {k: getattr(config, k) for k in published} == published
    assert config != method_class(method).Config()  # the protocol changed something
    # the default protocol runs the config's defaults; a grid option overrides the protocol's
    assert load_grid(grid_file, overrides).cells()[0].options == ()
    explicit = load_grid(grid_file, [*overrides, 'protocol="published"',
                                     f"options.{method}.lr=0.125"])
    assert dict(explicit.cells()[0].options) == {**published, "lr": 0.125}


def test_protocol_and_family_errors_name_the_problem(grid_file):
    with pytest.raises(ValueError, match="unknown protocol 'paper'; valid: dyn-paper, published"):
        load_grid(grid_file, ['protocol="paper"'])
    with pytest.raises(ValueError, match="unknown family 'svhn'"):
        load_grid(grid_file, ['datasets=[{name = "npz", path = "x.npz", family = "svhn"}]'])
    with pytest.raises(ValueError, match="needs the dataset family"):
        load_grid(grid_file, ['protocol="published"', 'methods=["tent"]',
                              'datasets=[{name = "npz", path = "x.npz"}]'])


def test_compile_reaches_backward_free_cells_only_and_changes_their_keys(grid_file):
    eager = load_grid(grid_file, ['methods=["dyn", "tent"]']).cells()
    compiled = load_grid(grid_file, ['methods=["dyn", "tent"]', "compile=true"]).cells()
    assert not any(c.compile for c in eager)
    assert {(c.method, c.compile) for c in compiled} == {("dyn", True), ("tent", False)}
    assert {(c.method, c.key == e.key) for c, e in zip(compiled, eager)} == {
        ("dyn", False), ("tent", True)}
    with pytest.raises(ValueError, match="compile must be true, false or a table .*'yes'"):
        load_grid(grid_file, ['compile="yes"'])
    table = load_grid(grid_file, ['methods=["dyn"]', 'compile={backend="eager"}']).cells()[0]
    assert table.compile_option == {"backend": "eager"} == table.to_dict()["compile"]
