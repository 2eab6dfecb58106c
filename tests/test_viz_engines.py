"""course_lib.viz.engines: the comparison table and figure from rows shaped like `sweep`'s, no server needed."""
import matplotlib

from course_lib.serve.bench import ClientRecord, summarize
from course_lib.viz.engines import comparison_table, load_saved, plot_engines

matplotlib.use("Agg")


def rows_for(engine, speed):
    rows = []
    for users in (1, 4):
        records = [ClientRecord(sent=0.0, chunk_times=[0.1 + k / speed for k in range(8)], output_tokens=8)
                   for _ in range(users)]
        rows.append({"engine": engine, "users": users, **summarize(records, duration=8 / speed + 0.1)})
    return rows


def test_table_has_one_column_group_per_engine_and_a_row_per_user_count():
    table = comparison_table(rows_for("a", 50.0) + rows_for("b", 20.0))
    assert list(table.index) == [1, 4]
    assert set(table.columns.get_level_values(0)) == {"a", "b"}
    assert table[("a", "ITL p50 (ms)")].iloc[0] == 20.0  # 1 / 50 tokens/s
    assert table[("a", "tokens/s")].iloc[1] > table[("a", "tokens/s")].iloc[0]


def test_plot_and_missing_saved_run(tmp_path):
    fig = plot_engines(rows_for("a", 50.0) + rows_for("b", 20.0), title="t")
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2
    assert load_saved(tmp_path / "none.json") is None
