"""``fedray report`` / ``fedray compare`` write one self-contained HTML page beside the PNGs
(issue 17): it parses as well-formed HTML, every image is an embedded PNG, nothing refers to
the network, run names are escaped; the plots carry the chance level and labelled axes, and
``compare`` shows runs that differ only in seed as mean ± sd over the seeds; the FAVoR
job's style plot has its chance levels and seed error bars."""

from __future__ import annotations

import base64
import os
import re
import statistics
from html.parser import HTMLParser

import pytest
from conftest import tiny_overrides

PNG = b"\x89PNG\r\n\x1a\n"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
NAME = 'orders <i>&</i> "quoted"'  # a run name HTML would misread if it were not escaped


class StrictPage(HTMLParser):
    """Well-formedness on top of html.parser (which accepts anything): a doctype, every
    non-void element closed in order, nothing left open; collects what a page refers to."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.doctype = False
        self.tags: list[tuple[str, dict]] = []
        self.styles: list[str] = []
        self.text: list[str] = []

    def handle_decl(self, decl: str) -> None:
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] == "style":
            self.styles.append(data)
        self.text.append(data)


def parse_page(path: str) -> StrictPage:
    """The page at ``path``, checked: well-formed, every <img> an embedded PNG, no script,
    no external reference of any kind."""
    with open(path, encoding="utf-8") as f:
        page = f.read()
    p = StrictPage()
    p.feed(page)
    p.close()
    assert p.doctype and not p.errors and not p.stack, (p.errors, p.stack)
    assert [t for t, _ in p.tags][:2] == ["html", "head"]
    for tag, attrs in p.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        for key in ("href", "src", "srcset", "action", "data"):
            value = attrs.get(key) or ""
            assert not re.match(r"\s*(https?:)?//", value), (tag, key, value)
        if tag == "img":
            prefix = "data:image/png;base64,"
            assert attrs["src"].startswith(prefix)
            assert base64.b64decode(attrs["src"][len(prefix):], validate=True).startswith(PNG)
    css = "".join(p.styles)
    assert "@import" not in css and "url(" not in css
    return p


def images(p: StrictPage) -> list[str]:
    return [a["alt"] for t, a in p.tags if t == "img"]


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    """Three 2-round runs on digits: FedAvg with seeds 1 and 2 (one config otherwise), and
    ORDERS (its report adds method sections) whose summary names it with HTML specials (a
    run's name is a plain name now; a summary from elsewhere is still only data)."""
    import json

    from fedray.core.config import load_config
    from fedray.runtime import run_experiment

    root = tmp_path_factory.mktemp("report_html")
    made = {}
    for key, extra in {"seed1": {"seed": 1}, "seed2": {"seed": 2},
                       "orders": {"seed": 1, "algorithm.name": "orders"}}.items():
        cfg = load_config(None, tiny_overrides(rounds=2, **extra))
        run_experiment(cfg, str(root / key), progress=False)
        made[key] = str(root / key)
    summary = root / "orders" / "summary.json"
    summary.write_text(json.dumps(json.loads(summary.read_text()) | {"name": NAME}))
    return made


@pytest.mark.ray
def test_report_html_is_valid_self_contained_and_escaped(runs):
    from fedray.front.report import report

    res = report(runs["orders"])
    assert os.path.dirname(res["html"]) == res["out_dir"] and res["html"].endswith(
        "report.html")
    p = parse_page(res["html"])
    # every plot, the method's sections included, is inline exactly once
    assert sorted(images(p)) == sorted(os.path.basename(x) for x in res["plots"])
    assert any(os.path.basename(x).startswith("orders_") for x in res["plots"])
    text = "".join(p.text)
    assert NAME in text  # shown as text, after unescaping...
    page = open(res["html"], encoding="utf-8").read()
    assert "<i>&</i>" not in page  # ...never as markup
    md = open(res["markdown"]).read()
    # the same table as REPORT.md: its header cells and one row for the run
    header = md.splitlines()[2].strip("| ").split(" | ")
    for col in header:
        assert col in text
    assert text.count(NAME) >= 2  # the title and the table's row
    assert "ORDERS diagnostics" in text


@pytest.mark.ray
def test_report_plots_draw_chance_and_say_what_is_better(runs):
    from fedray.front.report import report

    res = report(runs["seed1"])
    assert res["chance_level"] == pytest.approx(0.1)  # digits: 10 classes
    by_name = {os.path.basename(f["path"]): f for f in res["figures"]}
    assert {"accuracy_vs_round.png", "accuracy_vs_bytes.png"} <= set(by_name)
    for fig in res["figures"]:
        assert fig["title"] or all(ax["title"] for ax in fig["axes"])
        for ax in fig["axes"]:
            assert "accuracy" in ax["ylabel"] and "↑ better" in ax["ylabel"], ax
            assert "fraction correct" in ax["ylabel"]
            assert ax["chance"] == [pytest.approx(0.1)], ax
            assert ax["xlabel"]
    assert "log scale" in by_name["accuracy_vs_bytes.png"]["axes"][0]["xlabel"]
    assert "Chance on digits: 1/10 classes = 0.100" in open(res["markdown"]).read()
    parse_page(res["html"])


@pytest.mark.ray
def test_compare_groups_seeds_with_error_bars(runs, tmp_path):
    from fedray.front.report import compare

    res = compare([runs["seed1"], runs["seed2"], runs["orders"]], str(tmp_path / "cmp"))
    seeded = [g for g in res["groups"] if g["n"] > 1]
    assert len(res["groups"]) == 2 and len(seeded) == 1
    g = seeded[0]
    assert sorted(g["seeds"]) == [1, 2] and sorted(g["runs"]) == sorted(
        [runs["seed1"], runs["seed2"]])
    rows = {m["run"]: m for m in res["metrics"]}
    finals = [rows[os.path.basename(d)]["final_global_accuracy"] for d in g["runs"]]
    acc = g["metrics"]["final_global_accuracy"]
    assert acc["n"] == 2 and acc["mean"] == pytest.approx(statistics.mean(finals))
    assert acc["sd"] == pytest.approx(statistics.stdev(finals))
    assert "2 seeds" in g["label"]
    rnd = next(f for f in res["figures"] if f["path"].endswith("accuracy_vs_round.png"))
    assert [ax["error_bars"] for ax in rnd["axes"]] == [1, 1]  # the seed group, both panels
    assert all(ax["chance"] == [pytest.approx(0.1)] for ax in rnd["axes"])
    assert " vs " in rnd["title"]  # says what was compared
    md = open(res["markdown"]).read()
    assert "## Over seeds" in md and "±" in md
    p = parse_page(res["html"])
    assert res["html"].endswith("compare.html")
    assert sorted(images(p)) == sorted(os.path.basename(x) for x in res["plots"])


def test_markdown_html_escapes_and_never_links_out(tmp_path):
    """Text is escaped; an image that is not a local PNG is named, not fetched."""
    from fedray.observe.plots import markdown_html

    page = markdown_html("# r <b>\n\n| a | b |\n|---|---|\n| <script>x</script> | 1 |\n\n"
                         "- item & more\n\n![remote](http://example.com/x.png)\n"
                         "![missing](nothing.png)\n", str(tmp_path))
    path = tmp_path / "p.html"
    path.write_text(page, encoding="utf-8")
    p = parse_page(str(path))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "http://" not in page and images(p) == []
    assert "<title>r &lt;b&gt;</title>" in page


def test_only_the_reports_own_pngs_are_inlined(tmp_path):
    """An image line naming a PNG outside the report folder (absolute, '..', or through a
    link) is named, not inlined: a page never carries another file's bytes."""
    from fedray.observe.plots import markdown_html

    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    private = tmp_path / "private.png"
    private.write_bytes(png + b"SECRET")
    out = tmp_path / "report"
    out.mkdir()
    (out / "ok.png").write_bytes(png)
    os.symlink(private, out / "linked.png")
    page = markdown_html(f"# r\n\n![a]({private})\n![b](../private.png)\n"
                         f"![c](linked.png)\n![d](ok.png)\n", str(out))
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert [base64.b64decode(u) for u in uris] == [png]


def test_a_stored_run_name_stays_one_printable_line(tmp_path):
    from fedray.front.report import _load

    run = tmp_path / "run"
    (run / "metrics" / "rounds").mkdir(parents=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"round": [1]}), run / "rounds.parquet")
    (run / "summary.json").write_text('{"name": "x\\n![a](/home/u/private.png)\\n"}')
    label = _load(str(run))["label"]
    assert "\n" not in label and label.startswith("x\\n")


def test_favor_style_plot_has_chance_and_seed_error_bars(tmp_path):
    """FAVoR's style_retention.png from a results table with two seeds per method: the
    author-attribution chance is 1/authors, the AUC panels' 0.5, SemSim has none, and each
    method's bar is the mean with the sd over its seeds."""
    from fedray.methods.favor.plots import style_retention_plot

    rows = [{"method": m, "seed": s, "author_accuracy": a, "gen_gen_auc": 0.6 + s / 10,
             "gen_source_auc": float("nan"), "semsim": 0.3}
            for m, accs in {"favor": (0.2, 0.4), "fedavg": (0.1, 0.1)}.items()
            for s, a in enumerate(accs)]
    info = style_retention_plot(rows, str(tmp_path / "style_retention.png"), authors=50)
    with open(info["path"], "rb") as f:
        assert f.read(8) == PNG
    panels = {p["column"]: p for p in info["panels"]}
    assert panels["author_accuracy"]["chance"] == pytest.approx(0.02)
    assert panels["gen_gen_auc"]["chance"] == panels["gen_source_auc"]["chance"] == 0.5
    assert panels["semsim"]["chance"] is None
    favor = panels["author_accuracy"]["methods"][0]
    assert favor["method"] == "favor" and favor["n"] == 2
    assert favor["mean"] == pytest.approx(0.3) and favor["sd"] == pytest.approx(
        statistics.stdev([0.2, 0.4]))
    assert panels["gen_source_auc"]["methods"][0]["mean"] is None  # NaN: not computed
    assert [ax["chance"] for ax in info["axes"]] == [[pytest.approx(0.02)], [0.5], [0.5], []]
    assert all(ax["error_bars"] == 1 and "↑ better" in ax["ylabel"] for ax in info["axes"])
    assert "2 seeds" in info["title"]
