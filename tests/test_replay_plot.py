"""`ctxfold replay --plot`: the plot says what was run (window, compact ratio, price sheet), shows
the cache hits of every call, says where it was written, and refuses a folder that does not exist
before replaying anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxfold.replay import plot as plot_module
from ctxfold.replay.metrics import ReplayResult
from test_replay_cli import SMALL_TRACE, needs_traces, run_replay

pytest.importorskip("matplotlib")


def result(policy: str = "ctxfold") -> ReplayResult:
    return ReplayResult(
        trace="t.json",
        policy=policy,
        settings={"window": 8000, "ratio": 0.6},
        prices="openai-gpt-4.1",
        provider_cache="openai",
        series_view_tokens=[1000, 2000, 4000, 1500],
        series_cache_hit_tokens=[0, 1000, 2000, 0],
        series_actions=["none", "none", "none", "folded"],
        series_cumulative_cost=[0.1, 0.2, 0.4, 0.5],
    )


def test_hits_are_a_share_of_each_call() -> None:
    assert plot_module.hit_percentages(result()) == [0.0, 50.0, 50.0, 0.0]


def test_the_figure_labels_the_trigger_from_the_ratio_and_has_a_cache_hit_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Any] = []
    monkeypatch.setattr(plot_module, "save", lambda figure, path: drawn.append(figure))
    written = plot_module.plot([result()], tmp_path / "p.png", "the title", window=8000, compact_ratio=0.6)
    assert written == (tmp_path / "p.png").resolve()
    (figure,) = drawn
    tokens_axis, hits_axis, cost_axis = figure.axes
    labels = tokens_axis.get_legend_handles_labels()[1]
    assert "fold trigger 0.60 × window = 4,800" in labels and "window 8,000" in labels
    assert not [label for label in labels if "default" in label]
    assert tokens_axis.get_title() == "the title"
    assert "cache hits" in hits_axis.get_ylabel()
    (hits_line,) = hits_axis.get_lines()
    assert list(hits_line.get_ydata()) == [0.0, 50.0, 50.0, 0.0]
    assert "cost" in cost_axis.get_ylabel()


def test_a_missing_folder_is_refused_not_created(tmp_path: Path) -> None:
    with pytest.raises(plot_module.PlotError, match="does not exist; create it first"):
        plot_module.plot([result()], tmp_path / "nowhere" / "p.png", "t", window=8000)
    assert not (tmp_path / "nowhere").exists()


@needs_traces
def test_the_cli_refuses_a_missing_folder_before_replaying(tmp_path: Path) -> None:
    done = run_replay(tmp_path, str(SMALL_TRACE), "--plot", str(tmp_path / "nowhere" / "p.png"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().endswith(f"--plot: the folder {tmp_path / 'nowhere'} does not exist; create it first")
    assert not (tmp_path / "nowhere").exists()


@needs_traces
def test_the_cli_says_where_it_wrote(tmp_path: Path) -> None:
    done = run_replay(tmp_path, str(SMALL_TRACE), "--window", "8000", "--ratio", "0.6", "--prices",
                      "gpt-4.1", "--plot", "out.png")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"ctxfold replay: plot written to {tmp_path / 'out.png'}\n"
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
