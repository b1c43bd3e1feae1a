"""The integer-MoE mode of the golden LM and the greedy decode through the
golden tile: AR and Elastic-SD give the same tokens, equal to a plain greedy
decode of the integer-MoE model that does not go through the controller."""

import json
import numpy as np
import pytest

from elmoe3d.golden import esd as gesd
from elmoe3d.golden import lm as glm
from elmoe3d.golden import lm_int as li
from elmoe3d.golden import moe_layer as gml
from elmoe3d.sim.lm import evidence as ev

pytestmark = [pytest.mark.esd, pytest.mark.lm]


@pytest.fixture(scope="module")
def lm():
    w, meta = glm.load_weights()
    P = ev.heldout_prompts()
    im = li.IntMoE.from_model(w, meta, P[:16])
    return w, meta, im, P


def test_ragged_forward_equals_model_forward(lm):
    """The host's ragged forward (own KV cache per request) is the LM's
    forward when the requests have equal lengths."""
    w, meta, _, P = lm
    m = glm.MoEModel(w, meta, "float")
    toks = P[200:203, :20]
    ref, _ = m.forward(toks)
    caches = [m.new_cache(1, 32) for _ in range(3)]
    got = li.ragged_forward(m, list(toks), caches, lambda l, x: m.moe(l, x)[0])
    for b in range(3):
        np.testing.assert_allclose(got[b], ref[b], rtol=1e-4, atol=1e-4)
    assert all(c.length == 20 for c in caches)


def test_integer_layer_tracks_float(lm):
    """Each quantised layer on real FFN inputs stays close to its float
    reference (relative RMS error), and uses the LM's INT8 weights."""
    w, meta, im, P = lm
    xs = li.calibration_inputs(w, meta, P[100:104])
    for l, L in enumerate(im.layers):
        q, _ = glm.quantize(w[f"l{l}.w_gate"])
        assert (L.wg == q).all()
        x = xs[l][:64]
        xq = im.quant(l, x)
        y, _ = im.compute(l, xq, gml.Precision.FULL)
        yf = np.stack([gml.float_forward(L, xx * L.scales["x"]) for xx in xq])
        err = np.sqrt(np.mean((y * L.scales["y"] - yf) ** 2)) / np.sqrt(np.mean(yf ** 2))
        assert err < 0.15, (l, err)


def test_integer_moe_perplexity_close_to_float(lm):
    w, meta, im, _ = lm
    W = ev.heldout_windows(4)
    f = li.perplexity(glm.MoEModel(w, meta, "float"), W)["ppl"]
    q = li.perplexity(li.IntMoEModel(w, meta, im), W)["ppl"]
    assert abs(q - f) / f < 0.02, (f, q)


def test_decode_ar_sd_equal_golden_greedy(lm):
    """Greedy decode through the golden tile in AR and in SD gives the same
    tokens, and they equal the integer-MoE model's own greedy decode."""
    w, meta, im, P = lm
    prompts = [P[210][:24], P[211][:24]]
    ref, _, _ = li.IntMoEModel(w, meta, im).generate(np.stack(prompts), 10)
    ar = li.decode(w, meta, im, prompts, 10, mode="ar")
    sd = li.decode(w, meta, im, prompts, 10, mode="sd")
    want = [list(map(int, r[24:])) for r in ref]
    assert ar.tokens == want and sd.tokens == want
    assert all(r[0] == gesd.Mode.AR for r in ar.rounds)
    assert all(r[0] == gesd.Mode.SD for r in sd.rounds)
    assert sd.counters["accepted_tokens"] > 0
    # the SD run drafted from resident experts only
    draft_src = [e for e in sd.events if e.kind == gesd.EventKind.SOURCE
                 and e.phase == gesd.Phase.DRAFT]
    assert draft_src and all(e.code == gesd.Source.HB for e in draft_src)


def test_decode_batch_16_requests_drift_apart(lm):
    """Elastic-SD at batch 16: the requests accept different numbers of
    drafts, so their contexts drift apart (a request can run K tokens per
    round ahead of the slowest); the KV caches are sized for it (before: a
    cache too short for the fastest request, a broadcast error in the
    verify step). The tokens equal AR's (greedy verification is exact)."""
    w, meta, im, P = lm
    prompts = [P[220 + i][:24] for i in range(16)]
    sd = li.decode(w, meta, im, prompts, 8, mode="sd")
    assert [len(t) for t in sd.tokens] == [8] * 16
    acc = [a for m, _, a in sd.rounds if m == gesd.Mode.SD]
    assert any(len(set(a)) > 1 for a in acc)                 # the requests drifted apart
    assert li.decode(w, meta, im, prompts, 8, mode="ar").tokens == sd.tokens


def test_decode_bad_mode(lm):
    w, meta, im, P = lm
    with pytest.raises(ValueError, match="Decode mode"):
        li.decode(w, meta, im, [P[0][:4]], 2, mode="fast")


def test_decode_command(tmp_path, capsys):
    """`elmoe3d decode` (golden tile): text, counters, JSON; AR and SD agree."""
    import json

    from elmoe3d.cli import main
    outs = {}
    for mode in ("ar", "sd"):
        f = tmp_path / f"{mode}.json"
        assert main(["decode", "--prompt", "def main(", "--tokens", "6", "--mode", mode,
                     "--json", str(f), "--quiet"]) == 0
        d = json.loads(f.read_text())
        assert len(d["tokens_golden"][0]) == 6 and d["counters"]["tokens_out"] >= 5
        assert d["tokens_rtl"] is None and d["match"] is None
        outs[mode] = d
    assert outs["ar"]["tokens_golden"] == outs["sd"]["tokens_golden"]
    assert all(r["mode"] == "SD" for r in outs["sd"]["rounds"])
    assert "def main(" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["--tokens", "0"], "--tokens"), (["--batch", "17"], "--batch"),
    (["--prompt", ""], "empty prompt"), (["--rtl", "--tokens", "81"], "--tokens must be in 1..80"),
    (["--sim", "native"], "--sim native needs --rtl"),
    (["--prompt-file", "/nonexistent/x"], "does not exist"),
    (["--prompt", "a", "--prompt", "b", "--batch", "1"], "2 prompts")])
def test_decode_command_errors(argv, msg, capsys):
    from elmoe3d.cli import main
    assert main(["decode", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("elmoe3d: error:") and msg in err and err.count("\n") == 1


def test_decode_marks_the_prompt(capsys):
    """The decoded text says where the prompt ends (it did not: prompt and
    decoded bytes ran together off a terminal)."""
    from elmoe3d.cli import main
    assert main(["decode", "--prompt", "def main(", "--tokens", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "[prompt]  def main(\n[decoded] " in out and "9 prompt bytes, 3 decoded" in out


def test_decode_tokens_cap_is_the_context(tmp_path, capsys):
    """`--tokens` is bounded by the LM's 128-byte context minus the longest
    prompt, and `--help` says so (it was a silent cap of 24 whatever the
    prompt): 40 bytes after the default 48-byte prompt decode."""
    from elmoe3d.cli import main
    f = tmp_path / "d.json"
    assert main(["decode", "--tokens", "40", "--mode", "ar", "--quiet", "--json", str(f)]) == 0
    assert len(json.loads(f.read_text())["tokens_golden"][0]) == 40
    assert main(["decode", "--prompt", "x" * 96, "--tokens", "33"]) == 2
    assert "--tokens must be in 1..32 (the LM's context is 128 bytes and the longest prompt " \
           "has 96)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["decode", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "context is 128 bytes" in helptext and "80 for the default 48-byte" in helptext


def test_decode_empty_prompt_file_refused(tmp_path, capsys):
    """An empty (or blank) prompt file is refused, one line, exit 2 (it was
    silently replaced by a held-out prompt)."""
    from elmoe3d.cli import main
    f = tmp_path / "p.txt"
    f.write_text("\n  \n")
    assert main(["decode", "--prompt-file", str(f), "--tokens", "2", "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "has no prompt" in err and str(f) in err and not out


def test_decode_picture_checked_before_the_run(tmp_path, capsys):
    """`--picture` with `--mode ar` (no Elastic-SD round to draw), or into a
    place that cannot be written, is refused before decoding: one line,
    exit 2, nothing decoded (it failed after the whole decode, and the
    `--json` file was lost)."""
    from elmoe3d.cli import main
    js = tmp_path / "d.json"
    assert main(["decode", "--mode", "ar", "--tokens", "2", "--quiet", "--json", str(js),
                 "--picture", str(tmp_path / "r.svg")]) == 2
    out, err = capsys.readouterr()
    assert "--picture" in err and "--mode ar" in err and err.count("\n") == 1 and not out
    (tmp_path / "file").write_text("x")
    assert main(["decode", "--mode", "sd", "--tokens", "2", "--quiet",
                 "--picture", str(tmp_path / "file" / "r.svg")]) == 2
    out, err = capsys.readouterr()
    assert "--picture" in err and err.count("\n") == 1 and not out


def test_decode_picture_without_sd_round_keeps_the_json(tmp_path, capsys):
    """`--mode auto` at batch 1 runs AR rounds only: `--picture` then ends
    with a one-line error, but the decode's `--json` is written first."""
    from elmoe3d.cli import main
    js = tmp_path / "d.json"
    assert main(["decode", "--mode", "auto", "--tokens", "3", "--quiet", "--json", str(js),
                 "--picture", str(tmp_path / "r.svg")]) == 2
    err = capsys.readouterr().err
    assert "needs an Elastic-SD round" in err and err.count("\n") == 1
    assert len(json.loads(js.read_text())["tokens_golden"][0]) == 3


def test_decode_rtl_build_progress(monkeypatch, capsys):
    """`decode --rtl` reports the native build's phases on stderr while it
    builds (before: one line through a multi-minute build)."""
    from elmoe3d.cli import main
    from elmoe3d.sim.run import native_decode

    def fake(prompts, tokens, mode, build_progress=None, progress=None, **kw):
        build_progress("elaborating the tile (preset lm) to Verilog")
        build_progress("compiling Vtile_vm_classes_0.cpp (-O1, 40 s)")
        raise RuntimeError("stop here")
    monkeypatch.setattr(native_decode, "decode", fake)
    with pytest.raises(RuntimeError, match="stop here"):
        main(["decode", "--rtl", "--tokens", "2"])
    err = capsys.readouterr().err
    assert "elaborating the tile" in err and "compiling Vtile_vm_classes_0.cpp" in err


def test_report_reads_rtl_decodes(tmp_path):
    """The report's LM-through-the-tile table: figures from the tile's
    counters in `decode --rtl --json` files; a malformed file is named."""
    from elmoe3d.commands.decode import DECODE_HEAD, rtl_decode_rows
    from elmoe3d.hw.esd_ctrl import COUNTERS
    c = dict.fromkeys(COUNTERS, 0)
    c.update(hb_hits=3, hb_misses=1, hb_bytes=1_000_000, lpddr_bytes=3_000_000,
             accepted_tokens=6, rounds_sd=2, tokens_out=8)
    r = dict(mode="sd", batch=2, counters_rtl=c, cycles=80_000, match=True, trace_equal=True,
             counters_differ={})
    (tmp_path / "decode_rtl_x.json").write_text(json.dumps(r))
    (tmp_path / "other.json").write_text("{}")             # not a decode result: ignored
    [row] = rtl_decode_rows(tmp_path)
    got = dict(zip(DECODE_HEAD, row))
    assert got["run"] == "x" and got["mode"] == "SD" and got["HB hit rate"] == 0.75
    assert got["mean accepted len"] == 2.5                 # (6 + 2 * 2) / (2 * 2)
    assert got["HB share"] == 0.25 and got["cycles / token (RTL)"] == 10_000
    assert got["RTL tokens = golden"] == "yes" and got["trace, counters = golden"] == "yes"
    r["counters_differ"] = {"fills": [1, 2]}
    (tmp_path / "decode_rtl_x.json").write_text(json.dumps(r))
    assert rtl_decode_rows(tmp_path)[0][-1] == "NO"
    (tmp_path / "decode_rtl_bad.json").write_text("{\"mode\": 1}")
    with pytest.raises(ValueError, match="decode_rtl_bad.json"):
        rtl_decode_rows(tmp_path)


def test_rtl_decode_progress_bar(tmp_path, capsys):
    """`decode --rtl`'s progress bar: the cocotb decode writes "done total"
    (tb/tile_decode._progress_file) and the command's thread draws it."""
    import time

    from elmoe3d.commands.decode import _progress_thread
    from elmoe3d.tb.tile_decode import _progress_file
    path = tmp_path / "progress"
    write = _progress_file(str(path))
    stop = _progress_thread(path, time.monotonic(), quiet=False)
    write(3, 8)
    stop()                                          # draws the last count it finds
    err = capsys.readouterr().err
    assert "3/8 tokens" in err and err.endswith("\n")
    assert _progress_file(None) is None
    assert _progress_thread(path, 0.0, quiet=True)() is None


def test_report_reads_tile_runs(tmp_path):
    """The report's tile table: cycles per token from the tile's own phase
    counters, hit rate and accepted length beside the golden's; a run whose
    counters differ from the golden's says NO."""
    from elmoe3d.commands import decode as dec
    name = dec.report_traces(quick=True)[0][0]
    g = dec.report_runs(steps=4, traces=[name])
    runs = [dict(trace=name, batch=r["batch"], mode=r["mode"], steps=4,
                 rtl=dict(r["counters"], ar_cycles=0, draft_cycles=0, verify_cycles=0),
                 cycles=1) for r in g]
    c = runs[0]["rtl"]
    c.update(ar_cycles=1000, draft_cycles=200, verify_cycles=30)   # the golden counts no cycles
    runs[1]["rtl"]["hb_hits"] += 1
    path = tmp_path / dec.TILE_REPORT
    path.write_text(json.dumps({"runs": runs}))
    rows = dec.rtl_rows(path, cycles=True)
    got = dict(zip(dec.TILE_HEAD, rows[0]))
    assert got["cycles / token (RTL)"] == round(1230 / c["tokens_out"])
    assert rows[0][4:8:2] == rows[0][5:9:2] and got["RTL = golden"] == "yes"   # RTL, golden
    assert rows[1][-1] == "NO" and all(r[-1] == "yes" for r in rows[2:])


@pytest.mark.parametrize("argv,msg", [
    (["--prefetch", "8"], "--prefetch 8 needs --rtl on the native harness"),
    (["--prefetch", "8", "--rtl", "--sim", "cocotb"], "--prefetch 8 needs --rtl on the native"),
    (["--prefetch", "25", "--rtl"], "--prefetch must be in 0..24, not 25"),
])
def test_decode_prefetch_refused(argv, msg, capsys):
    """`decode --prefetch` outside the native RTL path, or deeper than the lm
    tile's slots: one line, exit 2, nothing decoded."""
    from elmoe3d.cli import main
    assert main(["decode", "--tokens", "2", "--quiet", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and msg in err and not out, err
