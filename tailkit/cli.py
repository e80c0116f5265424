"""The ``tailkit`` command line: one thin command per DVC stage, plus ``plugins`` and ``list``.

Each stage command loads the params, builds the registry and calls the stage's ``run``; user
mistakes (a :class:`~tailkit.errors.TailkitError`) print one ``Error:`` line and exit 2.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import click

from tailkit import progress
from tailkit.catalog import load_catalog, records
from tailkit.errors import InvalidParameterError, TailkitError
from tailkit.native.restart import restart_with_settled_environment
from tailkit.params import Params, load_params
from tailkit.paths import Layout
from tailkit.pipeline.stage_address import keyed_name, seeded_name, stage_address
from tailkit.registry import (
    KINDS,
    Registry,
    get_plugin_manager,
    get_registry,
    unknown_component,
)

params_option = click.option(
    "--params",
    "params_path",
    default="params.yaml",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Params file. Outputs (data/, metrics/, reports/) stay under the current directory, "
    "the DVC project root, wherever the params file is.",
)
quiet_option = click.option("--quiet", is_flag=True, help="No progress bar or summary line.")


def _guard(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except TailkitError as exc:
        click.echo(f"Error: {_capped(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRNOS:
            raise  # anything else is a bug of ours and keeps its traceback
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"Error: {where}{exc.strerror}{_ENVIRONMENT_ERRNOS[exc.errno]}", err=True)
        sys.exit(2)
    except MemoryError as exc:  # numpy's "Unable to allocate 7.11 PiB": a size in params
        said = str(exc) or "out of memory"
        click.echo(f"Error: {_capped(said)}; lower the sizes in params.yaml", err=True)
        sys.exit(2)


#: The OS errors that the machine, not tailkit, causes: a one-line error naming the file.
_ENVIRONMENT_ERRNOS = {
    errno.EACCES: " (check the folder's permissions)",
    errno.EPERM: " (check the folder's permissions)",
    errno.EROFS: " (the file system is read-only)",
    errno.ENOSPC: " (free some space and run again; the previous output is kept)",
    errno.EDQUOT: " (free some space and run again; the previous output is kept)",
    errno.ENAMETOOLONG: " (a shorter name or path)",
    errno.EIO: " (the disk or file system failed; check it and run again)",
}


#: The longest message printed whole: a value pasted into one (a megabyte-long string in
#: params.yaml) must not flood the terminal.
MESSAGE_CHARS = 1000


def _capped(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[:MESSAGE_CHARS]}… ({len(message) - MESSAGE_CHARS:,} more characters)"


def _context(params_path: Path, quiet: bool = True) -> tuple[Params, Layout, Registry]:
    """Params, layout and registry for a stage; turns progress bars on unless ``quiet``."""
    progress.configure(quiet)
    params = load_params(params_path)
    # The layout is the project's (the current directory, where dvc.yaml runs commands), not
    # the params file's folder: `--params configs/x.yaml` must not move data/ into configs/.
    return params, Layout(), get_registry()


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        click.echo(message, err=True)


class _WithPluginCommands(click.Group):
    """The built-in commands, and those plugins add through the ``register_commands`` hook,
    loaded only when a command name is not built in or the list is asked for. Only that hook
    is called (the plugins' entry modules are light): building the registry would import every
    component, torch and scikit-learn included (seconds), which ``--help``, ``compare`` or
    ``report`` never need."""

    _plugins_loaded = False

    def _load_plugins(self) -> None:
        if not self._plugins_loaded:
            self._plugins_loaded = True
            pm, _ = _guard(get_plugin_manager)
            pm.hook.register_commands(cli=self)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None:
            self._load_plugins()
            command = super().get_command(ctx, cmd_name)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        """tailkit's own commands, and the plugins' once something loaded them: ``--help``
        imports no plugin (a plugin hanging at import must not hang it), and a plugin's
        command still runs by name (:meth:`get_command`)."""
        return super().list_commands(ctx)


@click.group(
    cls=_WithPluginCommands,
    epilog="Commands that installed plugins add (register_commands) run by name; this list "
    "holds tailkit's own, read without importing any plugin.",
)
@click.version_option(package_name="tailkit")
def cli() -> None:
    """Long-tail and extreme classification pipeline (run the stages with `dvc repro`)."""


@cli.command()
@params_option
@quiet_option
def fingerprint(params_path: Path, quiet: bool) -> None:
    """Hash the source of every component params.yaml names into fingerprints/."""
    from tailkit.stages import fingerprint as stage

    records = _guard(lambda: stage.run(*_context(params_path, quiet)))
    _say(quiet, f"fingerprint: {len(records['experiments'])} experiments -> fingerprints/")


@cli.command()
@params_option
@quiet_option
def download(params_path: Path, quiet: bool) -> None:
    """Fetch the dataset's raw files into data/raw/ (verified)."""
    from tailkit.stages import download as stage

    path = _guard(lambda: stage.run(*_context(params_path, quiet)))
    _say(quiet, f"download: {path}")


@cli.command()
@params_option
@quiet_option
def subsample(params_path: Path, quiet: bool) -> None:
    """Split into train/val/test and apply the long-tail profile."""
    from tailkit.stages import subsample as stage

    meta = _guard(lambda: stage.run(*_context(params_path, quiet)))
    # rows: a single-label split's counts sum to its rows; a multi-label one's to its pairs
    rows = {s: int(meta.get(f"{s}_rows", meta[f"{s}_counts"].sum())) for s in stage.SPLITS}
    sizes = " / ".join(f"{n:,} {s}" for s, n in rows.items())
    line = f"subsample: {sizes} rows, {meta['num_classes']:,} classes"
    if meta.get("multilabel"):  # the counts are (row, label) pairs, not rows
        pairs = int(meta["train_counts"].sum())
        line += f" ({pairs:,} (row, label) pairs in train)"
    _say(quiet, line)


@cli.command()
@params_option
@click.option(
    "--features",
    "sets",
    multiple=True,
    help="Key of params.featurize to write (repeatable) [default: the DVC stage's (from "
    "DVC_STAGE), or every feature set].",
)
@quiet_option
def featurize(params_path: Path, sets: tuple[str, ...], quiet: bool) -> None:
    """Fit each feature set's featurizer and write its Parquet feature cache."""
    from tailkit.stages import featurize as stage

    context: tuple[Params, Layout, Registry] = _guard(lambda: _context(params_path, quiet))
    sets = sets or _guard(lambda: _stage_keys("featurize", "--features", context[0].featurize))
    for key in sets or tuple(context[0].featurize):
        meta = _guard(partial(stage.run, *context, key))
        name = meta["featurize"]["name"]
        _say(quiet, f"featurize@{key}: {name} -> {meta['dim']:,} {meta['kind']} dimensions")


@cli.command("fit-sampler")
@params_option
@click.option(
    "--sampler",
    "keys",
    multiple=True,
    help="Key of params.samplers to fit (repeatable; `none`: the directory of experiments "
    "without negatives) [default: the DVC stage's (from DVC_STAGE), or every one, and none].",
)
@quiet_option
def fit_sampler(params_path: Path, keys: tuple[str, ...], quiet: bool) -> None:
    """Fit the samplers named in params.samplers (dvc.yaml runs one per stage)."""
    from tailkit.stages import fit_sampler as stage

    context: tuple[Params, Layout, Registry] = _guard(lambda: _context(params_path, quiet))
    keys = keys or _guard(lambda: _stage_keys("fit-sampler", "--sampler", context[0].samplers))
    timings = _guard(lambda: stage.run(*context, list(keys) or None))
    fitted = ", ".join(f"{k} ({v['fit_seconds']:.2f} s)" for k, v in timings.items())
    _say(quiet, f"fit-sampler: {fitted or 'no samplers'}")


def _train_bar(name: str):
    """A step bar for train (None when bars are off) and the loop's progress callback."""
    if not progress.enabled():
        return None, None
    bar = progress.bar(desc=f"train {name}", unit="step", total=0)

    def update(step: int, total: int, postfix: dict[str, float]) -> None:
        bar.total = total
        bar.n = step
        if postfix:  # formatted here: tqdm would print 0.123456789
            bar.set_postfix_str(
                f"loss {postfix['loss']:.4g}, {postfix['ex/s']:,.0f} examples/s", refresh=False
            )
        bar.refresh()

    return bar, update


def _stage_keys(group: str, flag: str, names: Any) -> tuple[str, ...]:
    """The key of the ``group@<key>`` DVC stage running this command, or () outside one (the
    commands' default then covers every key)."""
    found = stage_address()
    if found is None or found[0] != group:
        return ()
    return (keyed_name(flag, {group: names}),)


#: The DVC stage groups that run each training or evaluation command: (foreach groups over
#: first-stage experiments, over decoupled runs; matrix groups over the same, with the seeds).
_RUN_GROUPS = {
    "train": (["train"], [], ["train-seed"], []),
    "train-decoupled": ([], ["train-decoupled"], [], ["train-decoupled-seed"]),
    "evaluate": (
        ["evaluate"],
        ["evaluate-decoupled"],
        ["evaluate-seed"],
        ["evaluate-decoupled-seed"],
    ),
}


def _which_run(
    params_path: Path, experiment: str | None, seed: int | None, command: str
) -> tuple[str, int | None]:
    """(experiment, seed) from the options, else from the DVC stage running this command
    (tailkit/pipeline/stage_address.py: dvc.yaml's commands carry no value from params.yaml)."""
    if experiment is not None:
        return experiment, seed
    params = load_params(params_path)
    firsts = [n for n, e in params.experiments.items() if not e.decoupled]
    seconds = [n for n, e in params.experiments.items() if e.decoupled]
    seeds = params.base.extra_seeds
    first, second, first_seeded, second_seeded = _RUN_GROUPS[command]
    single = {**dict.fromkeys(first, firsts), **dict.fromkeys(second, seconds)}
    matrix = {
        **dict.fromkeys(first_seeded, (firsts, seeds)),
        **dict.fromkeys(second_seeded, (seconds, seeds)),
    }
    return seeded_name("--experiment", single, matrix)


experiment_help = "[default: the DVC stage's, from DVC_STAGE]"

seed_option = click.option(
    "--seed",
    type=int,
    help="One of base.extra_seeds: run with it instead of base.seed; outputs go by "
    "<experiment>+seed<seed>.",
)


def _seeded(params_path: Path, quiet: bool, experiment: str, seed: int | None):
    """The stage's context and the name it runs under: the experiment's, or its seed run's."""
    params, layout, registry = _context(params_path, quiet)
    if seed is not None:
        params, experiment = params.seed_run(experiment, seed)
    return params, layout, registry, experiment


def _run_under_torchrun(params_path: Path) -> None:
    """When train.distributed asks for processes and none launched this one: run this same
    command under torchrun and exit with its code (tailkit/distributed/launch.py)."""
    from tailkit.distributed.launch import relaunch

    settings = _guard(lambda: load_params(params_path).train.distributed_settings)
    code = _guard(lambda: relaunch(settings, sys.argv[1:]))
    if code is not None:
        sys.exit(code)


def _quiet_rank(quiet: bool) -> bool:
    """Quiet, or a torchrun process other than rank 0: one voice per job."""
    return quiet or os.environ.get("RANK", "0") != "0"


@cli.command()
@params_option
@click.option("--experiment", help=f"Key of params.experiments to train {experiment_help}.")
@seed_option
@quiet_option
def train(params_path: Path, experiment: str | None, seed: int | None, quiet: bool) -> None:
    """Train one experiment (under torchrun when train.distributed asks for processes)."""
    from tailkit.stages import train as stage

    experiment, seed = _guard(lambda: _which_run(params_path, experiment, seed, "train"))
    _run_under_torchrun(params_path)
    _train(stage.run, params_path, experiment, quiet, "train", seed)


@cli.command("train-decoupled")
@params_option
@click.option("--experiment", help=f"Key of params.decoupled to train {experiment_help}.")
@seed_option
@quiet_option
def train_decoupled(
    params_path: Path, experiment: str | None, seed: int | None, quiet: bool
) -> None:
    """Train the second stage of a decoupled run (cRT, tau-norm, LWS) on its first stage (with
    --seed: on the first stage's run with that seed)."""
    from tailkit.stages import train_decoupled as stage

    experiment, seed = _guard(lambda: _which_run(params_path, experiment, seed, "train-decoupled"))
    _train(stage.run, params_path, experiment, quiet, "train-decoupled", seed)


def _train(
    run: Callable[..., Any],
    params_path: Path,
    experiment: str,
    quiet: bool,
    name: str,
    seed: int | None = None,
) -> None:
    quiet = _quiet_rank(quiet)
    progress.configure(quiet)
    bar, update = _train_bar(experiment)
    try:
        summary = _guard(
            lambda: run(*_seeded(params_path, quiet, experiment, seed), progress=update)
        )
    finally:
        if bar is not None:
            bar.close()
    done = "fitted" if summary["steps"] is None else f"{summary['steps']} steps"
    shown = experiment if seed is None else f"{experiment}-{seed}"  # the DVC stage's key
    _say(
        quiet,
        f"{name}{'' if seed is None else '-seed'}@{shown}: {done} in {summary['seconds']:.1f} s "
        f"({summary['examples_per_second']:,} examples/s on {summary['device']})",
    )


@cli.command()
@params_option
@click.option("--experiment", help=f"Key of params.experiments to evaluate {experiment_help}.")
@seed_option
@quiet_option
def evaluate(params_path: Path, experiment: str | None, seed: int | None, quiet: bool) -> None:
    """Evaluate one trained experiment on the test split."""
    from tailkit.stages import evaluate as stage

    experiment, seed = _guard(lambda: _which_run(params_path, experiment, seed, "evaluate"))
    _run_under_torchrun(params_path)
    quiet = _quiet_rank(quiet)

    metrics = _guard(lambda: stage.run(*_seeded(params_path, quiet, experiment, seed)))
    if "test" in metrics:  # rank 0's (or the one process's): the others write nothing
        _say(quiet, evaluate_summary(experiment, metrics["test"]))


def evaluate_summary(experiment: str, test: dict[str, Any]) -> str:
    """The one line ``evaluate`` prints: accuracy and balanced accuracy for single-label
    data, P@1, P@5 and PSP@5 for multi-label data (which has no accuracy)."""
    if "accuracy" in test:
        shown = {"accuracy": "accuracy", "balanced": "balanced_accuracy"}
    else:
        shown = {"P@1": "P@1", "P@5": "P@5", "PSP@5": "PSP@5"}
    parts = [f"{name} {test[key]:.4f}" for name, key in shown.items() if key in test]
    return f"evaluate@{experiment}: {', '.join(parts)}"


@cli.command()
@params_option
@click.option(
    "--exps",
    is_flag=True,
    help="Also tabulate finished DVC experiments (`dvc exp show --json`), grouped into studies; "
    "writes reports/experiments.md.",
)
@click.option(
    "--export",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the runs frame behind the tables (.parquet, .csv or .json).",
)
@click.option("--no-figures", is_flag=True, help="Skip the PNG figures.")
@quiet_option
def report(
    params_path: Path, exps: bool, export: Path | None, no_figures: bool, quiet: bool
) -> None:
    """Write reports/summary.md (and figures) from every experiment's metrics."""
    from tailkit.stages import report as stage

    layout = Layout(params_path.parent)
    done = _guard(
        lambda: stage.run(
            load_params(params_path), layout, include_exps=exps, export=export, draw=not no_figures
        )
    )
    if exps:
        click.echo(done.text)
    studies = f"{done.studies} {'study' if done.studies == 1 else 'studies'}"
    _say(quiet, f"report: {done.path} ({studies})")


@cli.command()
@params_option
def exps(params_path: Path) -> None:
    """The DVC experiments in one short table: per changed experiment, the settings it changed
    against the baseline and the study's headline metrics (`dvc exp show` lists every param)."""
    from tailkit.reporting.exps import exps_table
    from tailkit.reporting.runs import dvc_exp_show, exp_runs

    root = params_path.parent
    runs = _guard(lambda: exp_runs(dvc_exp_show(root), params_path.name, root))
    click.echo(exps_table(runs), nl=False)


@cli.command()
@click.option("--num-classes", required=True, type=click.IntRange(1), help="Labels C.")
@click.option("--dim", required=True, type=click.IntRange(1), help="Embedding width d.")
@click.option("--nproc", default=1, show_default=True, type=click.IntRange(1),
              help="Processes W sharing the labels (all hosts together).")  # fmt: skip
@click.option("--dtype", default="fp32", show_default=True,
              type=click.Choice(["fp32", "bf16", "fp16"]))  # fmt: skip
@click.option("--optimizer", default="adagrad", show_default=True,
              type=click.Choice(["adagrad", "sgd"]), help="sgd: with momentum.")  # fmt: skip
@click.option("--batch-size", default=4096, show_default=True, type=click.IntRange(1))
@click.option("--negatives", type=click.IntRange(1), default=None,
              help="Sampled mode with this many negatives a row; full softmax without it.")  # fmt: skip
@click.option("--label-chunk", default="auto", show_default=True,
              help="Full mode's labels a chunk (train.label_chunk): a number, auto or none.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def plan(
    num_classes: int,
    dim: int,
    nproc: int,
    dtype: str,
    optimizer: str,
    batch_size: int,
    negatives: int | None,
    label_chunk: str,
    as_json: bool,
) -> None:
    """Bytes per process of a label-sharded run: output layer, optimizer state, one step's
    activations, and bytes sent per step (tailkit/training/plan.py)."""
    from tailkit.training import plan as planning

    chunk: int | str | None = None if label_chunk == "none" else label_chunk
    if label_chunk not in ("auto", "none"):
        if not label_chunk.isdigit() or int(label_chunk) < 1:
            raise click.BadParameter("a positive number of labels, auto or none",
                                     param_hint="--label-chunk")  # fmt: skip
        chunk = int(label_chunk)
    p = planning.plan(num_classes, dim, nproc, dtype=dtype, optimizer=optimizer,
                      batch_size=batch_size, negatives=negatives, label_chunk=chunk)  # fmt: skip
    click.echo(json.dumps(planning.as_dict(p)) if as_json else planning.describe(p))


@cli.command()
@click.argument("a")
@click.argument("b")
@params_option
@click.option(
    "--metric",
    default=None,
    help="Per-class column to compare [default: recall@1; recall@k for multi-label tables].",
)
@click.option("--top", default=10, show_default=True, type=click.IntRange(0), help="Labels listed.")
@click.option(
    "--min-support",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    help="Test rows a label needs to be listed as gained or lost (the counts keep every label).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["md", "csv", "json", "parquet"]),
    default="md",
    show_default=True,
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here instead of stdout (required for parquet).",
)
@click.option("--no-figure", is_flag=True, help="Skip the PNG under reports/compare/.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the comparison's page here: one file that opens offline in a browser.",
)
def compare(
    a: str,
    b: str,
    params_path: Path,
    metric: str | None,
    top: int,
    min_support: int,
    fmt: str,
    out: Path | None,
    no_figure: bool,
    html_path: Path | None,
) -> None:
    """Per-class comparison of B against A: EXP (workspace), EXP@REV (git revision or DVC
    experiment) or NAME:EXP (as `tailkit report --exps` names rows)."""
    from tailkit.reporting import compare as module

    def run() -> tuple[str | bytes, Path | None]:
        root = params_path.parent
        if fmt == "parquet" and out is None:
            raise TailkitError("compare: --format parquet needs --out FILE")
        known = module.workspace_experiments(root, params_path)
        sources = [module.parse_source(s, known) for s in (a, b)]
        side_a, side_b = [module.load_side(root, source) for source in sources]
        first, second = [module.load_outcomes(root, source) for source in sources]
        result = module.compare(
            side_a,
            side_b,
            metric=metric,
            top=top,
            min_support=min_support,
            outcomes=(first, second),
        )
        figure = None if no_figure else module.draw(result, module.figure_path(root, result))
        if html_path is not None:
            from tailkit.reporting.html.comparison import comparison_page
            from tailkit.storage.atomic import atomic_path

            with atomic_path(html_path) as tmp:
                tmp.write_text(comparison_page(result, (first, second)))
        return module.render(result, fmt), figure

    text, figure = _guard(run)
    if out is not None:
        from tailkit.storage.atomic import atomic_path

        with atomic_path(out) as tmp:
            tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
    else:
        click.echo(text, nl=False)
    if figure is not None:
        click.echo(f"compare: figure {figure}", err=True)
    if html_path is not None:
        click.echo(f"compare: page {html_path} (open it in a browser)", err=True)


@cli.command()
@click.argument("rev", default="HEAD")
@params_option
def verify(rev: str, params_path: Path) -> None:
    """After a repro, say per experiment whether its numbers reproduce REV's [default: HEAD]:
    identical, within tolerance (with the likely cause) or different. Exits 1 only when one
    differs beyond the tolerance."""
    from tailkit.reporting import verify as module

    verdicts = _guard(lambda: module.verify(params_path.parent, rev))
    for verdict in verdicts:
        click.echo(verdict.line())
    if any(v.fails for v in verdicts):
        sys.exit(1)


@cli.command()
@params_option
@quiet_option
def seeds(params_path: Path, quiet: bool) -> None:
    """Write metrics/seeds.json: every metric as mean ± std over the training seeds."""
    from tailkit.stages import seeds as stage

    progress.configure(quiet)
    params = _guard(lambda: load_params(params_path))  # no registry: metrics files only
    aggregate = _guard(lambda: stage.run(params, Layout()))
    _say(quiet, f"seeds: {len(aggregate)} experiments over {len(params.seeds)} seeds")


@cli.command()
@params_option
@click.option("--experiment", required=True, help="Key of params.experiments to predict with.")
@seed_option
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Parquet or CSV of raw inputs (GeoNames: latitude, longitude; an optional id column).",
)
@click.option("--split", help="Predict one of the pipeline's splits instead: train, val or test.")
@click.option("--top-k", "k", default=5, show_default=True, type=int, help="Labels per row.")
@click.option(
    "--threshold", type=float, help="Keep only labels whose probability is at least this."
)
@click.option(
    "--output",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (.parquet or .jsonl); JSON lines on stdout when left out.",
)
def predict(
    params_path: Path,
    experiment: str,
    seed: int | None,
    input_path: Path | None,
    split: str | None,
    k: int,
    threshold: float | None,
    out: Path | None,
) -> None:
    """Top-k labels of a trained experiment, with its loss's calibrated probabilities, for new
    rows (--input) or a split of the pipeline (--split). Run `dvc repro` first."""

    def run() -> str | None:
        from tailkit.pipeline import predict_new_rows as predicting

        fmt = "jsonl"
        if out is not None:
            fmt = out.suffix.lower().lstrip(".")
            if fmt not in predicting.FORMATS:
                raise InvalidParameterError(f"--output: {out}: expected a .parquet or .jsonl file")
        params, layout, registry, name = _seeded(params_path, True, experiment, seed)
        table = predicting.run(
            params,
            layout,
            registry,
            name,
            input_path=input_path,
            split=split,
            k=k,
            threshold=threshold,
        )
        return predicting.write_records(table, out, fmt)

    text = _guard(run)
    if text is not None:
        click.echo(text, nl=False)


@cli.command()
@click.option(
    "--components",
    is_flag=True,
    help="Print every component's info record instead: options, modes and traits.",
)
def plugins(components: bool) -> None:
    """Print the installed plugins as JSON: distribution, version, registered names."""
    catalog = _guard(load_catalog)
    click.echo(json.dumps(catalog.components if components else catalog.plugins, indent=2))


@cli.command("list")
@click.argument("kind", type=click.Choice(KINDS))
def list_components(kind: str) -> None:
    """List the registered components of KIND with a one-line description each."""
    found = records(_guard(load_catalog), kind)
    primary = sorted({r["name"]: r for r in found.values()}.items())
    width = max((len(name) for name, _ in primary), default=0)
    for name, r in primary:
        click.echo(f"{name:<{width}}  {r['description']}  [{r['plugin']}]")


@cli.command()
@click.argument("targets", nargs=-1)
@click.option(
    "--jobs",
    "-j",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="Independent stages run at once; the cores are shared among them.",
)
@click.option("--force", "-f", is_flag=True, help="Run every stage, changed or not.")
def repro(targets: tuple[str, ...], jobs: int, force: bool) -> None:
    """`dvc repro [TARGETS]` with independent stages side by side (tailkit/pipeline/parallel_repro.py);
    the outputs and dvc.lock are those of a plain `dvc repro`."""
    from tailkit.pipeline import parallel_repro

    start = time.monotonic()
    finished = _guard(
        lambda: parallel_repro.reproduce(
            Path.cwd(), jobs, targets, force, report=partial(click.echo, err=True)
        )
    )
    ran = len(finished)
    click.echo(
        f"repro: {ran} job{'s' * (ran != 1)} run in {time.monotonic() - start:.0f} s", err=True
    )


@cli.command()
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
def options(kind: str, name: str) -> None:
    """Print the options component NAME of KIND takes in params.yaml: type, default, range."""
    found = records(_guard(load_catalog), kind)
    if name not in found:
        primary = sorted({r["name"] for r in found.values()})
        error = unknown_component(kind, name, found, primary, f"tailkit options {kind}")
        click.echo(f"Error: {error}", err=True)
        sys.exit(error.exit_code)
    record = found[name]
    click.echo(f"{record['name']}: {record['description']}  [{record['plugin']}]")
    if modes := record["traits"].get("modes"):
        click.echo(f"  takes: {' and '.join(f'{m} batches' for m in modes)}")
    rows = record["options"]
    if not rows:
        click.echo("  (no options)")
    widths = {k: max((len(r[k]) for r in rows), default=0) for k in ("name", "type", "default")}
    for r in rows:
        line = (
            f"  {r['name']:<{widths['name']}}  {r['type']:<{widths['type']}}  "
            f"default {r['default']:<{widths['default']}}  {r['allowed']}"
        )
        click.echo(line.rstrip())
        if r["doc"]:
            click.echo(f"      {r['doc']}")


@cli.command()
@click.option(
    "--data",
    "data",
    required=True,
    type=click.Path(path_type=Path),
    help="Your table: .parquet, .csv, .tsv or .jsonl.",
)
@click.option("--input", "input_column", required=True, help="Column of text or vectors.")
@click.option(
    "--label", "label_column", required=True, help="Column of labels (one or a list a row)."
)
@click.option("--split", "split_column", help="Column of train/val/test, if the table has one.")
@click.option("--label-separator", help="Splits a string label column into lists (CSV).")
@click.option(
    "--out",
    default=Path("params.yaml"),
    show_default=True,
    type=click.Path(path_type=Path),
    help="Where to write the params.",
)
@click.option("--force", is_flag=True, help="Replace an existing file.")
def init(
    data: Path,
    input_column: str,
    label_column: str,
    split_column: str | None,
    label_separator: str | None,
    out: Path,
    force: bool,
) -> None:
    """Write a commented params.yaml comparing softmax, logit adjustment and sampled softmax
    on your own table (read and checked now, as the pipeline will read it)."""
    from tailkit.pipeline.init_params import write_params
    from tailkit.plugins.datasets.table import Table

    columns = [c.strip() for c in input_column.split(",")]
    shape = _guard(
        lambda: write_params(
            Table(
                path=str(data),
                input=columns if len(columns) > 1 else columns[0],
                label=label_column,
                split=split_column,
                label_separator=label_separator,
            ),
            out,
            force,
        )
    )
    kind = "label lists" if shape.multilabel else "one label a row"
    click.echo(
        f"init: {out}: {shape.rows:,} rows, {shape.labels:,} labels ({kind}); "
        "run `tailkit repro` to compare softmax, logit-adjusted and sampled-unigram"
    )


def main() -> None:
    restart_with_settled_environment()  # settings read at load (tailkit/native/restart.py)
    cli()
