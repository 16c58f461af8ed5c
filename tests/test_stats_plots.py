"""ddtree_numba.stats (the acceptance sweep and its tables), the acceptance plots, the demo's
span marking, and ``ddtree-numba sweep / plot / demo`` on a small pair.

Checks are independent of the code under test: the sweep's tables against sums over the raw
per-round records, per-depth survival and histograms against brute-force counts, the marked
spans against the traced trees' accepted paths, and the pruned example tree against the full
tree's paths."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ddtree_numba as dd
import ddtree_numba.cli as cli
import ddtree_numba.demo as demo
from ddtree_numba import plots, stats
from test_decode import NoisyOracle, _greedy, _prompt

DATA = os.path.join(os.path.dirname(__file__), "data")
TARGET = os.path.join(DATA, "v3_noaux_tc")
DRAFTER = os.path.join(DATA, "drafters", "dflash_v3_noaux_tc")
N_NEW = 24


@pytest.fixture(scope="module")
def oracle_pair():
    target = dd.load_target(TARGET)
    prompt = _prompt(0, target.config.vocab_size)
    _, seq, feats = _greedy(target, prompt, N_NEW + 20)
    drafter = NoisyOracle(seq, feats, target.config.vocab_size, p=0.7, seed=5, block_size=8)
    return target, drafter, prompt


@pytest.fixture(scope="module")
def sweep(oracle_pair):
    target, drafter, prompt = oracle_pair
    return stats.acceptance_sweep(target, drafter, [{"ids": prompt, "module": "m"}], N_NEW, budgets=(2, 8, 32),
                                  example_budget=8, example_rounds=3, progress=False)


def test_the_sweep_is_exact_and_its_table_is_the_sum_of_its_rounds(sweep):
    assert sweep["budgets"] == [2, 8, 32] and sweep["block_size"] == 8 and sweep["schema"] == stats.SCHEMA
    assert {(r["method"], r["budget"]) for r in sweep["runs"]} == {("ar", None), ("dflash", None),
                                                                    ("ddtree", 2), ("ddtree", 8), ("ddtree", 32)}
    stats.check(sweep)                                          # every method's tokens == ar's
    assert {(r["loop"], r["stage_clock"]) for r in sweep["runs"]} == {("host", "host")}   # what timed them
    for row in stats.summary_rows(sweep):
        runs = [r for r in sweep["runs"] if r["method"] == row["method"] and r["budget"] == row["budget"]]
        acc = [a for r in runs for a in r["acceptance_lengths"]]
        assert row["rounds"] == len(acc)
        assert row["mean_acceptance"] == pytest.approx(sum(acc) / len(acc))
        assert row["tokens_per_forward"] == pytest.approx(sum(r["num_tokens"] for r in runs)
                                                          / sum(r["target_forwards"] for r in runs))
        # every token is the prefill's or a round's: forwards = rounds + 1 per prompt
        assert sum(r["target_forwards"] for r in runs) == len(acc) + len(runs)
        if row["method"] == "ddtree":
            assert max(r for run in runs for r in run["tree_sizes"]) <= row["budget"]
            assert max(acc) <= min(row["budget"], 7) + 1        # depth is capped by the block (L = 7)
    rows = {r["label"]: r for r in stats.summary_rows(sweep)}
    assert rows["AR"]["mean_acceptance"] == 1.0
    assert rows["DDTree 32"]["mean_acceptance"] > 2.0           # the oracle is right 70% at rank 0
    best = stats.best_row(sweep)
    assert best["mean_acceptance"] == max(r["mean_acceptance"] for r in rows.values() if r["method"] == "ddtree")


def test_check_names_a_run_that_is_not_exact(sweep):
    bad = json.loads(json.dumps(sweep))
    bad["runs"][3]["equals_ar"] = False
    with pytest.raises(ValueError, match=f"ddtree {bad['runs'][3]['budget']} on prompt 0"):
        stats.check(bad)


def _fake(lengths):
    return dict(budgets=[4], block_size=6, runs=[dict(method="ddtree", budget=4, acceptance_lengths=lengths)])


@pytest.mark.parametrize("seed", range(4))
def test_depth_survival_and_histogram_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 7, 50).tolist()
    s = _fake(lengths)
    d, reached, cond = stats.depth_survival(s, "ddtree", 4)
    assert d.tolist() == [1, 2, 3, 4, 5]
    for k in d:
        n_reached = sum(1 for a in lengths if a - 1 >= k)
        n_prev = sum(1 for a in lengths if a - 1 >= k - 1)
        assert reached[k - 1] == pytest.approx(n_reached / len(lengths))
        assert cond[k - 1] == pytest.approx(n_reached / n_prev) if n_prev else np.isnan(cond[k - 1])
    x, frac = stats.acceptance_histogram(s, "ddtree", 4)
    assert x.tolist() == [1, 2, 3, 4, 5, 6] and frac.sum() == pytest.approx(1.0)
    assert [frac[k - 1] * len(lengths) for k in x] == pytest.approx([lengths.count(k) for k in x])


def test_bad_sweep_inputs_raise(oracle_pair):
    target, drafter, prompt = oracle_pair
    for kwargs, msg in ((dict(budgets=()), "budgets"), (dict(budgets=(0,)), "budgets"),
                        (dict(max_new_tokens=0), "max_new_tokens")):
        with pytest.raises(ValueError, match=msg):
            stats.acceptance_sweep(target, drafter, [prompt], **{"max_new_tokens": 4, **kwargs})
    with pytest.raises(ValueError, match="distinct"):
        stats.acceptance_sweep(target, drafter, [prompt], 4, budgets=(8, 8))
    with pytest.raises(ValueError, match="non-integer"):
        stats.acceptance_sweep(target, drafter, [[1.7, 2.0]], 4)
    with pytest.raises(ValueError, match="at least one prompt"):
        stats.acceptance_sweep(target, drafter, [], 4)
    with pytest.raises(ValueError, match="prompt 1"):
        stats.acceptance_sweep(target, drafter, [prompt, []], 4)


def test_marked_spans_are_the_traced_accepted_paths(oracle_pair):
    target, drafter, prompt = oracle_pair
    res = dd.generate(target, drafter, prompt, N_NEW, method="ddtree", budget=16, trace=True)
    spans = demo.accepted_spans(res.tokens.tolist(), res.acceptance_lengths.tolist())
    assert spans[0][0] == 0 and spans[-1][1] == len(res.tokens)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))         # contiguous, in order
    drafted = [res.tokens[i:j].tolist() for i, j, hot in spans if hot]
    # each round's accepted drafted tokens, from its traced tree, in round order (empty ones dropped);
    # only the last round may be cut short by max_new_tokens
    from_trees = [t for t in ([int(tr.tree.tokens[k - 1]) for k in tr.keep[1:]] for tr in res.traces) if t]
    assert len(drafted) == len(from_trees) and drafted[:-1] == from_trees[:-1]
    assert 0 < len(drafted[-1]) <= len(from_trees[-1]) and drafted[-1] == from_trees[-1][:len(drafted[-1])]
    # the plain spans are the bonus tokens: one per round, plus the last forward's bonus
    bonuses = [res.tokens[i:j].tolist() for i, j, hot in spans if not hot]
    assert all(len(b) == 1 for b in bonuses) and [b[0] for b in bonuses[:len(res.traces)]] == \
        [int(tr.bonus) for tr in res.traces][:len(bonuses)]
    text = demo.marked_text(res.tokens.tolist(), res.acceptance_lengths.tolist(), colour=False)
    assert text.count("\u00ab") == len(drafted)
    assert "\x1b[" in demo.marked_text(res.tokens.tolist(), res.acceptance_lengths.tolist(), colour=True)


def test_byte_text():
    assert demo.byte_text(list(b"def f():\n") + [257]) == "def f():\n<EOS>"
    assert demo.byte_text([0xE2, 0x82, 0xAC, 0xFF]) == "\u20ac\\xff"
    assert plots.byte_label(32) == "\u2423" and plots.byte_label(65) == "A" and plots.byte_label(259) == "<MASK>"


@pytest.mark.parametrize("max_nodes", [3, 8, None])
def test_example_tree_keeps_paths_and_the_accepted_path(sweep, max_nodes):
    for ex in sweep["examples"]:
        tree, keep = plots.example_tree(ex, max_nodes)
        n = tree.num_nodes
        assert all(0 <= tree.parents[i] < i for i in range(1, n + 1))
        full_tokens, full_parents = ex["tokens"], ex["parents"]

        def path_tokens(node, toks, parents):
            out = []
            while node > 0:
                out.append(toks[node - 1])
                node = parents[node]
            return out[::-1]
        assert [path_tokens(k, tree.tokens.tolist(), tree.parents.tolist()) for k in keep] == \
               [path_tokens(k, full_tokens, full_parents) for k in ex["keep"]]
        assert n == (len(full_tokens) if max_nodes is None else len(set(range(min(len(full_tokens), max_nodes) + 1))
                                                                    | set(ex["keep"])) - 1)


def test_projected_tokens_per_s_against_hand_arithmetic(sweep):
    """R verified rows are a budget R-1 tree; the sweep's acceptance and other-stage time are
    interpolated in log2(budget) and held constant outside the sweep's budgets."""
    rows = {r["budget"]: r for r in stats.summary_rows(sweep) if r["method"] == "ddtree"}    # 2, 8, 32
    bench = dict(nodes=[3, 5, 9, 100], ms=[10.0, 20.0, 30.0, 40.0])
    x, y = stats.projected_tokens_per_s(sweep, bench)
    assert x.tolist() == [2, 4, 8, 99]

    def other(b):
        return rows[b]["round_ms"] - rows[b]["verify_ms"]
    acc4 = (rows[2]["mean_acceptance"] + rows[8]["mean_acceptance"]) / 2      # log2: 4 is halfway
    oth4 = (other(2) + other(8)) / 2
    want = [rows[2]["mean_acceptance"] / (1e-3 * (10.0 + other(2))), acc4 / (1e-3 * (20.0 + oth4)),
            rows[8]["mean_acceptance"] / (1e-3 * (30.0 + other(8))),
            rows[32]["mean_acceptance"] / (1e-3 * (40.0 + other(32)))]
    assert y.tolist() == pytest.approx(want)
    for bad in (dict(nodes=[3]), dict(nodes=[1], ms=[2.0]), dict(nodes=[3, 4], ms=[1.0])):
        with pytest.raises(ValueError, match="verify_bench"):
            stats.projected_tokens_per_s(sweep, bad)


def test_plots_draw_the_tables(sweep, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    ax = plots.plot_acceptance_vs_budget(sweep)
    line = [ln for ln in ax.get_lines() if ln.get_gid() == "ddtree"][0]
    rows = [r for r in stats.summary_rows(sweep) if r["method"] == "ddtree"]
    assert line.get_ydata().tolist() == pytest.approx([r["mean_acceptance"] for r in rows])
    ax = plots.plot_depth_acceptance(sweep, budgets=[8])
    assert {ln.get_gid() for ln in ax.get_lines()} == {"ddtree", "dflash"}
    with pytest.raises(ValueError, match="not in the sweep"):
        plots.plot_depth_acceptance(sweep, budgets=[5])
    gpu = dict(sweep, backend="cuda", graph="stages")
    written = plots.write_figures(sweep, tmp_path / "fig", cost_stats=gpu,
                                  verify_bench=dict(label="big", nodes=[3, 9], ms=[10.0, 12.0]), command="x y")
    names = [n for n, _ in written]
    assert names[:3] == ["acceptance_vs_budget.png", "depth_acceptance.png", "acceptance_histogram.png"]
    assert "cost_vs_budget.png" in names and "example_tree_1.png" in names
    readme = (tmp_path / "fig" / "README.md").read_text()
    assert "Made by `x y`" in readme and all(f"![{n}]({n})" in readme for n in names)
    assert "one CUDA graph a stage" in readme
    untimed = dict(gpu, runs=[dict(r, stage_times_s={**r["stage_times_s"], "verify": 0.0}) for r in gpu["runs"]])
    for cost in (dict(gpu, graph=True), dict(gpu, graph="auto"), untimed):    # no verify time apart to draw
        with pytest.raises(ValueError, match="--stage-graphs"):
            plots.write_figures(sweep, tmp_path / "fig3", cost_stats=cost)
    for n in names:
        assert (tmp_path / "fig" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="backend cuda"):
        plots.write_figures(sweep, tmp_path / "fig2", cost_stats=sweep)
    with pytest.raises(ValueError, match="give the GPU sweep"):
        plots.write_figures(sweep, tmp_path / "fig2", verify_bench=dict(nodes=[3], ms=[1.0]))
    with pytest.raises(ValueError, match="no device"):
        plots.write_figures({k: v for k, v in sweep.items() if k != "device"}, tmp_path / "fig2")


@pytest.fixture
def golden_demo_dir(tmp_path):
    """A stand-in demo directory: the golden target and DFlash drafter with a demo.json."""
    d = tmp_path / "demo"
    shutil.copytree(TARGET, d / "target")
    shutil.copytree(DRAFTER, d / "drafter")
    prompts = [dict(module=f"mod{i}.py", ids=_prompt(i, 96, n=9).tolist()) for i in range(2)]
    (d / "demo.json").write_text(json.dumps(dict(prompts=prompts, target=dict(params=1), drafter=dict(params=1))))
    return d


def test_cli_demo_sweep_plot(golden_demo_dir, tmp_path, capsys):
    assert cli.main(["demo", "--backend", "numpy", "--max-new-tokens", "8", "--prompts", "2", "--budget", "4",
                     "--no-progress", "--colour", "never", "--pair", str(golden_demo_dir)]) == 0
    out = capsys.readouterr().out
    assert "backend numpy" in out and "mod1.py" in out and "tokens equal: yes" in out
    assert "forwards saved" in out and "mean acceptance" in out
    path = tmp_path / "s.json"
    assert cli.main(["sweep", "--out", str(path), "--budgets", "2", "4", "--max-new-tokens", "6",
                     "--backend", "numpy", "--no-progress", "--pair", str(golden_demo_dir)]) == 0
    s = json.loads(path.read_text())
    assert s["budgets"] == [2, 4] and len(s["prompts"]) == 2 and s["command"].startswith("ddtree-numba sweep")
    assert "DDTree 4" in capsys.readouterr().out
    assert cli.main(["plot", str(path), "--out", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "acceptance_vs_budget.png").is_file()


def test_cli_batch_sweep_and_its_figure(golden_demo_dir, tmp_path, capsys):
    """``sweep --batch``: ar and ddtree through generate_batch at each batch size, every sequence
    equal to its ar, the experts a verify reads growing with the batch; ``plot`` draws it."""
    path = tmp_path / "b.json"
    assert cli.main(["sweep", "--out", str(path), "--batch", "1", "3", "--budgets", "4", "--max-new-tokens", "6",
                     "--backend", "numpy", "--no-progress", "--pair", str(golden_demo_dir)]) == 0
    s = json.loads(path.read_text())
    assert s["kind"] == "batch_sweep" and s["batches"] == [1, 3]
    assert {(r["batch"], r["method"], r["budget"]) for r in s["rows"]} == {
        (b, m, k) for b in (1, 3) for m, k in (("ar", None), ("ddtree", 4))}
    assert all(r["equal_ar"] for r in s["rows"])
    ar = {r["batch"]: r for r in s["rows"] if r["method"] == "ar"}
    # ar runs every sequence the same rounds, and the batch of 3 holds the batch of 1's sequence:
    # its routers pick a superset of experts every round
    assert ar[3]["unique_experts"] >= ar[1]["unique_experts"] > 0
    assert ar[3]["rows_per_round"] == 3 and ar[1]["rows_per_round"] == 1
    # every batch size decodes every prompt: one call a prompt at batch 1; one pass (numpy)
    assert ar[1]["calls"] == s["prompts"] and ar[3]["calls"] == -(-s["prompts"] // 3)
    assert s["repeats"] == 1 and all(r["tokens_per_s_runs"] == [r["tokens_per_s"]] for r in s["rows"])
    assert "batch" in capsys.readouterr().out
    assert cli.main(["plot", str(path), "--out", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "batch_sweep.png").is_file()
    assert "![batch_sweep.png](batch_sweep.png)" in (tmp_path / "figs" / "README.md").read_text()


def test_the_moonlight_batch_benchmark_plots_as_a_batch_sweep(tmp_path):
    """``benchmarks/results/batch.json`` (benchmarks/batch.py, H200) through
    ``stats.batch_sweep_from_benchmark``: every curve of the figure is the file's own tokens/s and
    unique experts, ar's budget None; ``ddtree-numba plot`` writes it; other JSON is refused by name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ddtree_numba.stats import batch_sweep_from_benchmark

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "batch.json"
    raw = json.loads(path.read_text())
    sweep = batch_sweep_from_benchmark(raw, n_routed_experts=64)
    assert sweep["kind"] == "batch_sweep" and sweep["budgets"] == sorted({r["budget"] for r in raw["rows"]
                                                                          if r["method"] != "ar"})
    left, right = plots.plot_batch_sweep(sweep)
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in left.get_lines()}
    for label, method, budget in [("AR", "ar", None)] + [(f"DDTree, budget {b}", "ddtree", b) for b in sweep["budgets"]]:
        rows = sorted((r for r in raw["rows"] if r["method"] == method and (budget is None or r["budget"] == budget)),
                      key=lambda r: r["batch"])
        assert curves[label] == ([r["batch"] for r in rows], [r["tokens_per_s"] for r in rows])
    assert any(list(line.get_ydata()) == [64, 64] for line in right.get_lines())      # the ceiling
    plt.close(left.figure)
    assert cli.main(["plot", str(path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "batch_benchmark.png").is_file()
    # its caption says what ran; a second figure in the same directory keeps the first's section
    plots.write_batch_figure(dict(sweep, source=None, prompts=8, max_new_tokens=128, repeats=3), tmp_path, "b.png")
    readme = (tmp_path / "README.md").read_text()
    assert "![batch_benchmark.png](batch_benchmark.png)" in readme and "![b.png](b.png)" in readme
    assert "random weights" in readme and "median of 3 timed passes" in readme
    assert f"commit {raw['commit']}" in readme
    with pytest.raises(ValueError, match="benchmarks/batch.py record"):
        batch_sweep_from_benchmark(dict(raw, benchmark="gemm"))
    with pytest.raises(ValueError, match="lack"):
        batch_sweep_from_benchmark(dict(raw, rows=[{"batch": 1}]))


@pytest.mark.parametrize("argv, msg", [
    (["demo", "--prompts", "0"], "--prompts must be >= 1"),
    (["demo", "--budget", "0", "--backend", "numpy"], "--budget must be >= 1"),
    (["sweep", "--out", "x.json", "--budgets", "0"], "--budgets must all be >= 1"),
    (["sweep", "--out", "x.json", "--batch", "2", "2", "--backend", "numpy"], "--batch must be distinct"),
    (["sweep", "--out", "x.json", "--target", TARGET], "both --target and --drafter"),
    (["sweep", "--out", "x.json", "--target", TARGET, "--drafter", DRAFTER], "--prompt-ids is needed"),
    (["plot", "/nonexistent.json"], "STATS /nonexistent.json"),
    (["sweep", "--out", "/nonexistent/dir/x.json"], "cannot write a file there"),
    (["sweep", "--out", "x.json", "--budgets", "8", "8"], "--budgets must be distinct"),
    (["sweep", "--out", "x.json", "--stage-graphs", "--backend", "numpy"], "--stage-graphs says how a cuda backend"),
    (["sweep", "--out", "x.json", "--eager", "--backend", "numpy"], "--eager says how a cuda backend"),
])
def test_cli_bad_input_exits_2(golden_demo_dir, capsys, argv, msg):
    assert cli.main(argv) == 2
    assert msg in capsys.readouterr().err


def test_cli_plot_rejects_malformed_inputs(sweep, tmp_path, capsys):
    good = tmp_path / "s.json"
    good.write_text(json.dumps(sweep))
    cases = [("[1, 2]", [], "not a sweep's statistics"),
             (json.dumps({k: v for k, v in sweep.items() if k != "date"}), [], "no date"),
             (json.dumps(sweep), ["--verify-bench", str(good)], "give --cost"),
             (json.dumps(sweep), ["--cost", str(good)], "backend cuda")]
    for text, extra, msg in cases:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert cli.main(["plot", str(bad), "--out", str(tmp_path / "f"), *extra]) == 2
        assert msg in capsys.readouterr().err


def test_depth_tables_need_a_budget_for_ddtree(sweep):
    with pytest.raises(ValueError, match="ddtree needs one of the sweep's budgets"):
        stats.depth_survival(sweep, "ddtree")


def test_cli_demo_without_the_pair_names_the_training_command(tmp_path, capsys):
    assert cli.main(["demo", "--backend", "numpy", "--pair", str(tmp_path / "none")]) == 2
    assert "tools/train_demo.py" in capsys.readouterr().err


def test_a_character_split_between_spans_prints_whole():
    ids = list("a\u20acb".encode())                     # the euro sign is 3 bytes: split over spans
    assert demo.marked_text(ids, [2, 2], colour=False) == "a\u00ab\u20ac\u00bbb"
    assert demo.marked_text(ids, [2, 2], colour=False).replace("\u00ab", "").replace("\u00bb", "") == \
        demo.byte_text(ids)
