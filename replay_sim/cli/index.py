"""Index and evaluation commands: ``index build`` and ``eval``."""

from __future__ import annotations

from pathlib import Path

import click
from tqdm import tqdm

from replay_sim.cli import cli, db_option, match_config_option
from replay_sim.cli.progress import Progress
from replay_sim.replay.stdio.start import START_TABLE
from replay_sim.replay.stdio.start.write import write_start_table
from replay_sim.resolve.build import build_index
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.learning import learn as learn_confidence
from replay_sim.resolve.confidence.model import MODEL_FILE
from replay_sim.resolve.confidence.population import prior
from replay_sim.resolve.confidence.reliability import cross_validated, render_calibration
from replay_sim.resolve.confidence.reliability import plot as plot_reliability
from replay_sim.resolve.embedders import EMBEDDINGS, embedder_for, index_embedder
from replay_sim.resolve.embedding import CachedEmbedder, default_embedder
from replay_sim.resolve.evaluate import compare, load_probes, render
from replay_sim.resolve.evaluate import explain as explain_report
from replay_sim.resolve.floor import exact_floor, render_floor
from replay_sim.resolve.index import DEFAULT_INDEX_DIR
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.tooleffects import keep_effects
from replay_sim.store import Store

index_dir_option = click.option(
    "--index-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_INDEX_DIR,
    show_default=True,
    help="Vector index folder.",
)


@cli.group("index")
def index_group() -> None:
    """Build the vector index of a store."""


@index_group.command("build")
@db_option
@index_dir_option
@match_config_option
@click.option(
    "--embedding",
    type=click.Choice(sorted(EMBEDDINGS)),
    default=None,
    help="Embedding model: minilm (all-MiniLM-L6-v2, the default) or minilm-static (its static token "
    "vectors: 12-24x faster on CPU, opt-in; docs: Benchmarks). Default: the one the index was built with, "
    "else minilm. Another one than the index's rebuilds it.",
)
@click.option(
    "--full",
    is_flag=True,
    help="Learn the confidence model from every recording again (default: on a store that only grew, "
    "reuse the kept leave-one-out examples and form those of the new and affected recordings).",
)
def build_command(
    db: Path, index_dir: Path, match_config: MatchConfig | None, embedding: str | None, full: bool
) -> None:
    """Embed new recordings and bring the index up to date (incremental); keep the tools' learned effects."""
    model = embedder_for(EMBEDDINGS[embedding]) if embedding else index_embedder(index_dir)
    with Store(db, create=False) as store:
        schemas = RecordedSchemas(store, match_config)
        embedder = CachedEmbedder(model, store)
        with tqdm(total=0, unit="call", desc="indexing", disable=None) as bar:

            def progress(done: int, total: int) -> None:
                if bar.disable:  # not a terminal (a log, CI): lines instead of a bar
                    _progress_line(done, total)
                bar.total = total
                bar.update(done - bar.n)

            index = build_index(store, schemas, embedder, index_dir, progress=progress)
        keep_effects(store, match_config)  # the next replay reads them instead of learning them
        learned = learn_confidence(store, index_dir, match_config, full=full)
    parts = len(index.partitions)
    vectors = sum(len(p) for p in index.partitions.values())
    click.echo(
        f"indexed {vectors} calls in {parts} partitions into {index_dir} ({index.model_id}; "
        f"{embedder.encoded} embedded, {embedder.reused} from cache)"
    )
    update = learned.update or {}
    how = (
        f" ({update.get('kept', 0)} kept, formed afresh for {update.get('formed', 0)} new or affected "
        "recordings)"
        if learned.source == "incremental"
        else ""
    )
    population = prior()
    toward = f", fitted toward {population.examples} answers of real servers" if population.examples else ""
    click.echo(
        f"confidence model {index_dir / MODEL_FILE}: {learned.examples} leave-one-out examples{how}, "
        f"{learned.positives} right{toward}"
    )
    table = index_dir / START_TABLE
    if match_config is not None:  # a stdio start answers only under the default matching config
        table.unlink(missing_ok=True)
        return
    with Progress("preparing the stdio start", "call") as progress:
        answered = write_start_table(db, index_dir, progress)
    click.echo(f"stdio start table {table}: {answered} calls answered before the replay loads")


def _progress_line(done: int, total: int) -> None:
    """Say how far ``index build`` is, one line at a time (stderr)."""
    if done == 0 and total:
        said = f"{total} calls to index (loading the embedding model may take a minute)"
    elif done == 0:
        said = "no new calls to index"
    else:
        said = f"{done}/{total} calls indexed"
    click.echo(f"indexing: {said}", err=True)


@cli.command("eval")
@click.argument("probes", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@db_option
@index_dir_option
@match_config_option
@click.option("--baselines/--no-baselines", default=True, show_default=True, help="Also score the baselines.")
@click.option(
    "--explain", is_flag=True, help="Also list replay-sim's wrong hits and needless misses, and why."
)
@click.option(
    "--floor",
    is_flag=True,
    help="Also count the exact repeats the exact cache answers right that replay-sim refuses, and why.",
)
@click.option(
    "--sessionless",
    is_flag=True,
    help="Score replay-sim as the MCP SDK client's default mode meets it: no episode, no session.",
)
@click.option(
    "--min-confidence",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Operating point: serve answers whose learned confidence reaches it (default: strict tiers).",
)
@click.option(
    "--calibration",
    is_flag=True,
    help="Also score the operating points cross-validated by server: precision, recall, ECE and "
    "a reliability table (a PNG beside PROBES with --plot, when matplotlib is installed).",
)
@click.option(
    "--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Reliability PNG."
)
def eval_command(
    probes: Path,
    db: Path,
    index_dir: Path,
    match_config: MatchConfig | None,
    baselines: bool,
    explain: bool,
    floor: bool,
    sessionless: bool,
    min_confidence: float | None,
    calibration: bool,
    plot: Path | None,
) -> None:
    """Score the resolver on PROBES.jsonl (live truth) against exact-only and naive baselines."""
    with Store(db, create=False) as store:
        resolver = Resolver(store, config=match_config, index_dir=index_dir, min_confidence=min_confidence)
        resolver.confidence.growth = None  # scores the model the index holds: never refitted mid-run
        embedder = CachedEmbedder(default_embedder(), store) if baselines else None
        loaded = load_probes(probes)
        reports = compare(store, loaded, resolver, embedder, sessionless=sessionless)
        refused = exact_floor(resolver, loaded, sessionless=sessionless) if floor else None
        scored = cross_validated(resolver, loaded) if calibration else None
    click.echo(render(reports))
    if scored is not None:
        click.echo(
            "\nCalibration, cross-validated by server:\n\n"
            + render_calibration(scored, {k: v for k, v in reports.items() if k != "replay-sim"})
        )
        if plot is not None:
            wrote = plot_reliability(scored, plot)
            click.echo(f"reliability diagram {plot}" if wrote else "no PNG: matplotlib is not installed")
    if refused is not None:
        click.echo("\n" + render_floor(refused))
    if explain:
        click.echo("\nreplay-sim's wrong hits and needless misses:\n" + explain_report(reports["replay-sim"]))
