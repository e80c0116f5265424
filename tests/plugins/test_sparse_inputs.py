"""Sparse inputs end to end: CSR rows, their checks, the sparse featurizers and encoders, and
training on them (issue 16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import torch

from tailkit.csr import check_rows
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.featurizers.geocells import GeoCells
from tailkit.plugins.featurizers.tfidf import Tfidf
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.sparse import SPARSE_GRAD_COLUMNS, SparseLinear, SparseMLP
from tailkit.plugins.samplers.tree import TreeSampler
from tailkit.plugins.samplers.tree.pca import WhitenedPCA
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.sparse import SparseRows
from tailkit.storage.feature_cache import read_features, write_features
from tailkit.training.loop import LoopConfig, train


def _csr(n: int, d: int, density: float = 0.1, seed: int = 0) -> sp.csr_matrix:
    x = sp.random(n, d, density=density, format="csr", dtype=np.float32, random_state=seed)
    x.data += 0.5  # no explicit zeros
    return x


# --- SparseRows ----------------------------------------------------------------------------


def test_rows_select_slice_and_multiply_like_the_dense_matrix() -> None:
    x = _csr(50, 17, density=0.3).tolil()
    x[7] = 0  # an empty row
    x = x.tocsr()
    x.eliminate_zeros()
    rows = SparseRows.from_scipy(x)
    dense = torch.from_numpy(x.toarray())
    assert rows.shape == (50, 17) and len(rows) == 50 and rows.nnz == x.nnz
    pick = torch.tensor([7, 3, 3, 49, 0])  # repeats and the empty row
    np.testing.assert_array_equal(rows.index_select(0, pick).to_dense(), dense[pick])
    np.testing.assert_array_equal(rows[pick].to_dense(), dense[pick])
    np.testing.assert_array_equal(rows[5:12].to_dense(), dense[5:12])
    np.testing.assert_array_equal(rows[::7].to_dense(), dense[::7])
    np.testing.assert_array_equal(rows[torch.tensor([], dtype=torch.int64)].to_dense(), dense[:0])
    w = torch.randn(17, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(rows.matmul(w), dense @ w)
    torch.testing.assert_close(rows[pick].matmul(w), dense[pick] @ w)
    back = rows[5:12].to_scipy()
    assert (back != x[5:12]).nnz == 0


def test_check_rows_names_the_first_bad_row() -> None:
    indptr, indices, values = np.array([0, 2, 2, 5]), np.array([1, 4, 0, 2, 3]), np.ones(5)
    check_rows(indptr, indices, values, 5, "f")  # valid, with an empty row
    cases = [
        (np.array([1, 4, 0, 2, 5]), values, r"^f: row 2: column id 5 outside \[0, 5\)$"),
        (np.array([1, 4, 0, 3, 2]), values, r"^f: row 2: column ids not strictly increasing"),
        (np.array([4, 4, 0, 2, 3]), values, r"^f: row 0: column ids not strictly increasing"),
        (np.array([1, 4, -1, 2, 3]), values, r"^f: row 2: column id -1 outside"),
        (indices, np.array([1, 1, 1, np.nan, 1]), r"^f: row 2: value nan in column 2$"),
        (indices, np.array([np.inf, 1, 1, 1, 1]), r"^f: row 0: value inf in column 1$"),
    ]
    for bad_indices, bad_values, match in cases:
        with pytest.raises(ValueError, match=match):
            check_rows(indptr, bad_indices, bad_values, 5, "f")
    with pytest.raises(ValueError, match="row pointer"):
        check_rows(np.array([0, 2, 4]), indices, values, 5, "f")


def _write_raw_sparse(path: Path, idx: list[list[int]], val: list[list[float]], dim: int) -> None:
    """A feature file as another tool might write it: the cache's schema, unchecked data."""
    n = len(idx)
    table = pa.table(
        {
            "row_id": pa.array(np.arange(n), pa.int64()),
            "label": pa.array(np.zeros(n, np.int64)),
            "idx": pa.array(idx, pa.list_(pa.int32())),
            "val": pa.array(val, pa.list_(pa.float32())),
        }
    )
    meta = {"dim": dim, "num_rows": n, "kind": "sparse", "nnz": sum(map(len, idx))}
    import json

    pq.write_table(table.replace_schema_metadata({b"tailkit": json.dumps(meta).encode()}), path)


@pytest.mark.parametrize(
    ("idx", "val", "match"),
    [
        ([[0, 1], [2, 9]], [[1, 1], [1, 1]], r"row 1: column id 9 outside \[0, 4\)"),
        ([[0, 1], [3, 2]], [[1, 1], [1, 1]], r"row 1: column ids not strictly increasing"),
        ([[0, 1], [2, 3]], [[1, float("nan")], [1, 1]], r"row 0: value nan in column 1"),
    ],
)
def test_a_bad_sparse_file_is_one_line_naming_file_and_row(tmp_path, idx, val, match) -> None:
    path = tmp_path / "f.parquet"
    _write_raw_sparse(path, idx, val, 4)
    with pytest.raises(DataValidationError, match=match) as info:
        read_features(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_sparse_features_round_trip_through_the_cache_exactly(tmp_path) -> None:
    counts = _csr(300, 80, density=0.05, seed=3)
    counts.data = np.ceil(counts.data * 3)
    featurizer = Tfidf().fit(counts)
    x = featurizer.transform(counts)
    path = tmp_path / "train.parquet"
    write_features(path, x, np.arange(300) % 7, np.arange(300), {})
    back = read_features(path)
    assert back.kind == "sparse" and back.shape == x.shape
    np.testing.assert_array_equal(back.x.indptr.numpy(), x.indptr)
    np.testing.assert_array_equal(back.x.indices.numpy(), x.indices)
    np.testing.assert_array_equal(back.x.values.numpy(), x.data)


# --- featurizers ---------------------------------------------------------------------------


def test_tfidf_is_sublinear_smoothed_idf_with_unit_rows() -> None:
    counts = sp.csr_matrix(np.array([[3, 0, 1, 0], [0, 0, 2, 0], [1, 1, 0, 0]], np.float64))
    x = Tfidf().fit(counts).transform(counts)
    # independent formula: tf = 1 + ln(count), idf = ln((1 + n) / (1 + df)) + 1, rows L2-normed;
    # column 3 is in no training row, so it keeps no column (df >= min_df = 1)
    c = counts.toarray()[:, :3]
    df = (c > 0).sum(0)
    tf = np.where(c > 0, 1 + np.log(np.where(c > 0, c, 1)), 0)
    w = tf * (np.log(4 / (1 + df)) + 1)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    assert x.dtype == np.float32 and x.shape == (3, 3) and x.has_sorted_indices
    np.testing.assert_allclose(x.toarray(), w, rtol=1e-6)


def test_tfidf_vocabulary_cut_keeps_the_most_frequent_columns() -> None:
    dense = np.array([[1, 1, 1, 0, 1], [1, 0, 1, 0, 0], [1, 0, 0, 1, 1], [1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"takes integer counts; row \d+ holds -"):
        Tfidf().fit(sp.csr_matrix(-dense))
    # document frequencies 4, 1, 2, 1, 2: the top three are 0, 2 and 4 (2 and 4 tie; both kept)
    f = Tfidf(max_features=3).fit(sp.csr_matrix(dense))
    assert f.columns.tolist() == [0, 2, 4]
    assert Tfidf(min_df=2).fit(sp.csr_matrix(dense)).columns.tolist() == [0, 2, 4]
    assert Tfidf(max_features=2).fit(sp.csr_matrix(dense)).columns.tolist() == [0, 2]
    out = f.transform(sp.csr_matrix(dense))
    assert out.shape == (4, 3)
    with pytest.raises(ValueError, match="fitted on 5 columns; got 4"):
        f.transform(sp.csr_matrix(dense[:, :4]))


def _unit(lat_deg, lon_deg) -> np.ndarray:
    lat, lon = np.radians(lat_deg), np.radians(lon_deg)
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)


def test_geocells_share_cells_by_distance_and_scale() -> None:
    places = _unit(
        np.array([48.851, 48.857, 45.761, -33.871]), np.array([2.351, 2.357, 4.841, 151.21])
    )
    f = GeoCells(finest=0.04, levels=9, tilings=2).fit(places)
    x = f.transform(places).toarray()
    active = (x > 0).sum(1)
    assert active.tolist() == [18, 18, 18, 18]  # one cell per level and tiling
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-6)
    shared = (x[:, None, :] > 0) & (x[None, :, :] > 0)
    common = shared.sum(-1)
    # Paris–Paris (1 km) share most cells, Paris–Lyon (390 km) only coarse ones, Sydney none
    assert common[0, 1] > common[0, 2] > common[0, 3] == 0
    # the same positions as (lat, lon) degrees give the same features
    lat_lon = np.array([[48.851, 2.351], [48.857, 2.357], [45.761, 4.841], [-33.871, 151.21]])
    np.testing.assert_array_equal(f.transform(lat_lon).toarray(), x)
    # an unseen place activates only the cells training saw
    far = f.transform(_unit(np.array([0.0]), np.array([-30.0])))
    assert far.nnz == 0 and far.shape == (1, x.shape[1])


def test_geocells_wrap_at_the_antimeridian() -> None:
    pair = np.array([[10.0, 179.99], [10.0, -179.99]])
    x = GeoCells(finest=1.0, levels=1, tilings=2).fit(pair).transform(pair).toarray()
    # the shifted tiling puts both sides of the antimeridian into one cell
    assert ((x[0] > 0) & (x[1] > 0)).sum() == 1


def test_geocells_refuse_a_bad_position_naming_the_row() -> None:
    with pytest.raises(ValueError, match="row 1 has latitude 91"):
        GeoCells().fit(np.array([[0.0, 0.0], [91.0, 0.0]]))
    with pytest.raises(ValueError, match="row 0 is not a position"):
        GeoCells().fit(np.zeros((2, 3)))


# --- encoders ------------------------------------------------------------------------------


def test_sparse_linear_equals_the_dense_product_and_its_gradient() -> None:
    torch.manual_seed(0)
    x = _csr(32, 40, density=0.2)
    model = SparseLinear(40, dim=6, sparse_grad=True)
    rows = SparseRows.from_scipy(x)
    z = model(rows)
    dense = torch.from_numpy(x.toarray())
    weight = model.embed.weight.detach().clone().requires_grad_(True)
    expected = dense @ weight
    torch.testing.assert_close(z, expected)
    g = torch.randn(32, 6, generator=torch.Generator().manual_seed(1))
    (z * g).sum().backward()
    (expected * g).sum().backward()
    grad = model.embed.weight.grad
    assert grad.is_sparse  # only the batch's columns are touched
    torch.testing.assert_close(grad.to_dense(), weight.grad)


def test_sparse_mlp_equals_its_dense_computation() -> None:
    torch.manual_seed(0)
    x = _csr(16, 30, density=0.2)
    model = SparseMLP(30, hidden=[8, 5], dim=4, sparse_grad=False)
    with torch.no_grad():
        model.bias.normal_()
    dense = torch.from_numpy(x.toarray())
    first, second = model.net[1], model.net[3]  # Linear(8, 5), Linear(5, 4)
    h = torch.relu(dense @ model.embed.weight + model.bias)
    h = torch.relu(h @ first.weight.T + first.bias)
    expected = torch.relu(h @ second.weight.T + second.bias)
    torch.testing.assert_close(model(SparseRows.from_scipy(x)), expected)
    model(SparseRows.from_scipy(x)).sum().backward()
    assert not model.embed.weight.grad.is_sparse  # sparse_grad: false gives a dense gradient
    # by default, sparse gradients from SPARSE_GRAD_COLUMNS columns on
    assert not SparseLinear(SPARSE_GRAD_COLUMNS - 1, dim=2).embed.sparse
    assert SparseLinear(SPARSE_GRAD_COLUMNS, dim=2).embed.sparse
    with pytest.raises(TypeError, match="reads sparse rows"):
        model(dense)


# --- training on sparse rows ---------------------------------------------------------------

C, D = 10, 200


def _sparse_data(n: int, seed: int) -> tuple[SparseRows, torch.Tensor]:
    """Each class owns 20 columns; a row activates 4 of its class's and 2 random ones."""
    rng = np.random.default_rng(seed)
    y = rng.integers(C, size=n)
    own = y[:, None] * 20 + rng.integers(20, size=(n, 4))
    noise = rng.integers(D, size=(n, 2))
    cols = np.concatenate([own, noise], axis=1)
    x = sp.csr_matrix(
        (np.ones(cols.size, np.float32), (np.repeat(np.arange(n), 6), cols.ravel())), shape=(n, D)
    )
    x.sum_duplicates()
    x.data /= np.sqrt(6)
    return SparseRows.from_scipy(x), torch.from_numpy(y)


@pytest.mark.parametrize("mode", ["full", "sampled", "sampled-tree"])
def test_losses_and_samplers_train_on_sparse_rows(mode: str) -> None:
    loss, sampler, negatives = SoftmaxCE(), None, 0
    if mode == "sampled":
        loss, sampler, negatives = SampledSoftmax(), UniformSampler(), 4
    elif mode == "sampled-tree":  # whitened PCA of sparse rows, then the tree
        loss, sampler, negatives = SampledSoftmax(), TreeSampler(k=4), 4
    curve = _train_sparse(loss, sampler, negatives, sparse_grad=mode != "full")  # both kinds
    assert curve[-1]["loss"] < curve[0]["loss"]
    # chance is 0.1; the tree's k = 4 whitened directions cannot separate 10 classes' negatives
    assert curve[-1]["val_accuracy"] > (0.75 if mode == "sampled-tree" else 0.9)


def _train_sparse(loss, sampler, negatives: int, sparse_grad: bool = True) -> list[dict]:
    """The learning curve of ``SparseLinear`` (dim 8) trained by the loop for 4 epochs on
    :func:`_sparse_data`, with ``sampler`` (when given) fitted on the training rows."""
    torch.manual_seed(0)
    x, y = _sparse_data(800, 0)
    xv, yv = _sparse_data(300, 1)
    if sampler is not None:
        sampler.fit(x, y, C)
    encoder = SparseLinear(D, dim=8, sparse_grad=sparse_grad)
    layer = OutputLayer.for_loss(loss, C, 8, generator=torch.Generator().manual_seed(0))
    return train(
        cfg=LoopConfig("s", epochs=4, batch_size=64, negatives=negatives, eval_every=13),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=RowSparseAdagrad(lr=0.2),
        x_train=x,
        y_train=y,
        x_val=xv,
        y_val=yv,
        class_counts=torch.bincount(y, minlength=C).double(),
    ).curve


def test_sparse_pca_whitens_without_densifying() -> None:
    x = _csr(400, 60, density=0.1, seed=5)
    pca = WhitenedPCA(5).fit(x)
    z = pca.transform(x).astype(np.float64)
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(5), atol=1e-4)
    # the sparse transform equals the centred dense one
    np.testing.assert_allclose(
        z, (x.toarray() - pca.mean) @ pca.transform_matrix.T, rtol=1e-4, atol=1e-5
    )
    tree = TreeSampler(k=5)
    rows = SparseRows.from_scipy(x)
    tree.fit(rows, torch.from_numpy(np.arange(400) % 7), 7)
    dense = torch.from_numpy(x.toarray())
    torch.testing.assert_close(
        tree.whiten(rows[:50]), tree.whiten(dense[:50]), atol=1e-4, rtol=1e-4
    )


def test_weight_decay_on_a_sparse_input_layer_is_refused() -> None:
    layer = OutputLayer(C, 8)
    encoder = SparseLinear(D, dim=8, sparse_grad=True)
    with pytest.raises(InvalidParameterError, match=r"^opt.weight_decay: .*sparse_grad: false$"):
        RowSparseSGD(lr=0.1, weight_decay=1e-4).attach(
            layer, list(encoder.parameters()), sparse_tables=[encoder.embed.weight], owner="opt"
        )


def test_a_featurizer_giving_bad_sparse_rows_is_named_with_the_row() -> None:
    from tailkit.errors import PluginError
    from tailkit.pipeline.featurizing import as_output

    good = sp.csr_matrix(np.array([[0, 1.0, 0], [2.0, 0, 3.0]], np.float32))
    assert (as_output(good, "sparse", "f") != good).nnz == 0
    bad = good.copy()
    bad.data[2] = np.nan
    with pytest.raises(PluginError, match=r"^featurizer 'f' output: row 1: value nan in column 2$"):
        as_output(bad, "sparse", "f")


def _registered(kind: str):
    # the hooks' registry, not get_registry: this runs at collection, before the fixture that
    # keeps the catalog in the session's folder, and must not write the user's cache
    from tailkit.registry import full_registry

    return full_registry().components(kind)


@pytest.mark.parametrize("component", _registered("losses"), ids=lambda c: c.name)
def test_every_loss_trains_a_sparse_encoder(component) -> None:
    """Every registered loss, with its default options (a sampled one over uniform negatives),
    trains the sparse encoder with sparse gradients well above chance (0.1)."""
    loss = component.factory()
    sampler = UniformSampler() if component.modes == ("sampled",) else None
    curve = _train_sparse(loss, sampler, 4 if sampler else 0)
    assert all(np.isfinite(row["loss"]) for row in curve)
    assert curve[-1]["val_accuracy"] > 0.6


@pytest.mark.parametrize("component", _registered("samplers"), ids=lambda c: c.name)
def test_every_sampler_draws_negatives_for_a_sparse_encoder(component) -> None:
    """Every registered sampler, fitted on sparse rows, gives sampled softmax its negatives."""
    options = {"k": 4} if component.name == "tree" else {}
    curve = _train_sparse(SampledSoftmax(), component.factory(**options), 4)
    assert curve[-1]["val_accuracy"] > 0.6
