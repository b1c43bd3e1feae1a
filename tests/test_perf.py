"""System-level performance and energy model (issue 6): model shapes, traces,
caches, acceptance, the systems and the grid, the CLI and the report section."""

import json
import time

import numpy as np
import pytest

from elmoe3d.golden.tag_unit import TagUnitModel
from elmoe3d.sim.perf import acceptance as acc
from elmoe3d.sim.perf.cache import LRUCache, TagCache, belady_hits
from elmoe3d.sim.perf.grid import ablations, locality_check, run_grid, side_by_side
from elmoe3d.sim.perf.hardware import get_hardware, rtl_figures
from elmoe3d.sim.perf.models import get_model, model_names
from elmoe3d.sim.perf.systems import SYSTEMS, Workload, run_system
from elmoe3d.sim.perf.traces import generate, load_trace, save_trace

pytestmark = pytest.mark.perf


# -- model shapes ---------------------------------------------------------------------

@pytest.mark.parametrize("name,total_b", [
    ("Qwen3-30B-A3B", 30.5), ("GPT-OSS-20B", 20.9), ("DeepSeek-V2-Lite", 15.7),
    ("Mixtral-8x7B", 46.7), ("OLMoE-1B-7B", 6.9)])
def test_model_totals_match_published(name, total_b):
    """Parameter totals from the shapes agree with the published model sizes (+-3%)."""
    assert get_model(name).total_params / 1e9 == pytest.approx(total_b, rel=0.03)


def test_kv_bytes_follow_attention_type():
    q = get_model("Qwen3-30B-A3B")          # GQA: 2 * kv_heads * head_dim per layer
    assert q.kv_bytes(1, 2) == 2 * 4 * 128 * 2 * 48
    d = get_model("DeepSeek-V2-Lite")       # MLA: kv_lora + rope per layer
    assert d.kv_bytes(1, 2) == (512 + 64) * 2 * 27
    g = get_model("GPT-OSS-20B")            # sliding window (128) on every other layer
    assert g.kv_bytes(1000, 1) == 12 * 2 * 8 * 64 * 1000 + 12 * 2 * 8 * 64 * 128


def test_unknown_model():
    with pytest.raises(ValueError, match="Unknown model 'Llama-9'"):
        get_model("Llama-9")
    assert len(model_names()) == 6


# -- traces ---------------------------------------------------------------------------

def test_trace_roundtrip(tmp_path):
    t = generate(6, 16, 2, requests=3, steps=10, dense_layers=(0,), seed=3, model="toy")
    assert (t.experts[:, 0] == -1).all()
    for suffix in (".npz", ".jsonl"):
        p = save_trace(tmp_path / f"t{suffix}", t)
        u = load_trace(p)
        assert np.array_equal(u.experts, t.experts)
        assert np.array_equal(u.request, t.request) and np.array_equal(u.position, t.position)
        assert u.num_experts == 16 and u.model == "toy"
    s = u.streams(3)
    assert s.shape == (3, 10, 6, 2)
    assert u.streams(6).shape[0] == 6        # requests cut into segments


def test_trace_locality_parameters():
    """Reuse across consecutive tokens and broader early layers are what the generator makes."""
    def reuse_of(t):
        s = t.streams(4)
        same = [len(set(s[b, i, l]) & set(s[b, i - 1, l])) / 4
                for b in range(4) for i in range(1, s.shape[1]) for l in range(s.shape[2])]
        return float(np.mean(same))
    lo = generate(4, 64, 4, requests=4, steps=60, reuse=0.1, seed=1)
    hi = generate(4, 64, 4, requests=4, steps=60, reuse=0.7, seed=1)
    assert reuse_of(hi) > 0.7 > reuse_of(lo) + 0.4
    t = generate(6, 64, 4, requests=8, steps=40, zipf=1.2, early_zipf=0.0, early_layers=1,
                 reuse=0.0, request_spread=0.0, seed=2)
    distinct = [len(np.unique(t.experts[:, l])) for l in range(6)]
    top_share = [np.bincount(t.experts[:, l].ravel(), minlength=64).max() / t.experts[:, l].size
                 for l in range(6)]
    assert top_share[0] < min(top_share[1:])          # flatter popularity in the early layer
    assert distinct[0] >= max(distinct[1:])


@pytest.mark.parametrize("content,msg", [
    ({"experts": np.zeros((4, 2), np.int32)}, "3-D"),
    ({"other": np.zeros(3)}, "no 'experts' array"),
    ({"experts": np.full((4, 2, 2), 9), "meta": np.array(json.dumps({"num_experts": 4}))}, "-1..3"),
    ({"experts": np.zeros((4, 2, 2), np.int32), "meta": np.array("{bad")}, "not JSON"),
])
def test_malformed_npz(tmp_path, content, msg):
    p = tmp_path / "bad.npz"
    np.savez(p, **content)
    with pytest.raises(ValueError, match=msg) as e:
        load_trace(p)
    assert "\n" not in str(e.value) and "bad.npz" in str(e.value)


@pytest.mark.parametrize("text,msg", [
    ("", "empty"),
    ('{"format": "other"}\n{"experts": [[1]]}\n', "header"),
    ('{"format": "elmoe3d-trace"}\n{"experts": [[1, 2], [3]]}\n', "ragged"),
    ('{"format": "elmoe3d-trace"}\nnot json\n', "bad JSON"),
    ('{"format": "elmoe3d-trace"}\n', "no token lines"),
])
def test_malformed_jsonl(tmp_path, text, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=msg) as e:
        load_trace(p)
    assert "\n" not in str(e.value)


def test_trace_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(tmp_path / "nope.npz")
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(ValueError, match="must end in .npz or .jsonl"):
        load_trace(tmp_path / "x.csv")
    (tmp_path / "z.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="Malformed trace file"):
        load_trace(tmp_path / "z.npz")


# -- caches ----------------------------------------------------------------------------

def test_belady_and_lru_textbook():
    """The textbook reference string, 3 frames: OPT 9 faults, LRU 12 faults."""
    seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    assert len(seq) - belady_hits(seq, 3) == 9
    lru = LRUCache(3)
    assert len(seq) - sum(lru.access(k) for k in seq) == 12


def test_belady_bounds_lru_random():
    rng = np.random.default_rng(0)
    for _ in range(20):
        seq = rng.zipf(1.5, 300).tolist()
        cap = int(rng.integers(1, 12))
        lru = LRUCache(cap)
        assert belady_hits(seq, cap) >= sum(lru.access(k) for k in seq)


def test_tag_cache_is_the_golden_policy():
    """The ELMoE-3D cache is the golden tag unit: same victims, same counters."""
    tc = TagCache(4, 2, 8, hot_bits=4, decay_shift=1)
    ref = TagUnitModel(slots=4, layer_bits=1, expert_bits=3, hot_bits=4, decay_shift=1, plane_bits=2)
    assert isinstance(tc.tu, TagUnitModel)
    rng = np.random.default_rng(5)
    for i in range(300):
        l, e = int(rng.integers(2)), int(rng.integers(8))
        tag = tc.tag(l, e)
        hit, filled = tc.access(tag, planes=1, hot=2)
        h2, _, _ = ref.lookup(tag)
        if not h2:
            ref.allocate(tag, 1, 2)
        assert hit == h2
        tc.release()
        if i % 7 == 0:
            tc.decay()
            ref.decay()
    assert tc.tu.stats() == ref.stats()
    assert tc.tu.tags == ref.tags and tc.tu.hot == ref.hot


# -- acceptance ------------------------------------------------------------------------

def test_precision_errors_and_rates():
    e = {p: acc.precision_error(p) for p in acc.PRECISIONS}
    assert e["full"] == 0 < e["augmented"] < e["truncated"]
    m = acc.AcceptanceModel(0.9, 1.0, 4.0)
    r = m.rate(np.array([0.2, 0.5, 1.0]), "augmented")
    assert np.all(np.diff(r) > 0) and r[-1] <= 0.9
    assert m.rate(1.0, "truncated") < 0.5 * m.rate(1.0, "augmented")
    assert acc.expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    rng = np.random.default_rng(0)
    n = acc.sample_accepted(np.full(20000, 0.6), 4, rng)
    assert n.mean() == pytest.approx(acc.expected_accepted(0.6, 4), rel=0.03)


def test_measured_acceptance_file(tmp_path):
    rows = [dict(draft_len=4, resident_fraction=f, policy="hotness", precision="augmented",
                 acceptance_rate=a) for f, a in ((0.1, 0.3), (0.5, 0.7))]
    p = tmp_path / "acc.json"
    p.write_text(json.dumps({"rows": rows, "source": "test"}))
    m = acc.AcceptanceModel.from_config({}, p)
    assert float(m.rate(0.0, "augmented", resident_fraction=0.3, draft_len=4)) == pytest.approx(0.5)
    assert "measured" in m.source
    # with mean_accepted (issue 7 writes it), the per-token rate is solved from it
    rows = [dict(draft_len=4, resident_fraction=0.5, policy="hotness", precision="augmented",
                 acceptance_rate=0.1, mean_accepted=acc.expected_accepted(0.8, 4))]
    p.write_text(json.dumps(rows))
    m = acc.AcceptanceModel.from_config({}, p)
    assert float(m.rate(0.0, "augmented", resident_fraction=0.5, draft_len=4)) == pytest.approx(0.8, abs=1e-6)
    # a precision without rows falls back to the model
    assert float(m.rate(1.0, "truncated", resident_fraction=0.5)) == pytest.approx(
        float(acc.AcceptanceModel().rate(1.0, "truncated")))
    p.write_text(json.dumps([{"draft_len": 4}]))
    with pytest.raises(ValueError, match="Malformed acceptance file"):
        acc.load_measured(p)


# -- hardware / RTL figures ------------------------------------------------------------

def test_rtl_figures_fallback_and_file(tmp_path):
    f = rtl_figures(tmp_path)
    assert f["pe_efficiency"] == 1.0 and f["draft_cycle_ratio"] == 0.5
    assert "fallback" in f["source"]
    (tmp_path / "throughput-pe-default-verilator.json").write_text(json.dumps({"figures": {
        "FULL": {"beats": 80, "input_cycles": 100, "cycles_per_dot": 10.0},
        "DRAFT_k1": {"beats": 40, "input_cycles": 50, "cycles_per_dot": 5.0}}}))
    (tmp_path / "hb_bandwidth.json").write_text(json.dumps({"figures": {
        "reads_with_fills": {"words_per_cycle_per_bank": 0.9}}}))
    f = rtl_figures(tmp_path)
    assert f["pe_efficiency"] == 0.8 and f["hb_efficiency"] == 0.9
    assert f["sources"]["pe"].startswith("throughput-pe")


# -- systems -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ds2_points():
    m, hw = get_model("DeepSeek-V2-Lite"), get_hardware()
    out = {}
    for b in (1, 16):
        w = Workload(m, hw, b)
        out[b] = (w, {s: run_system(s, w) for s in SYSTEMS})
    return out


def test_xpu_is_the_analytic_roofline(ds2_points):
    """xPU tokens/s = tokens / (LPDDR bytes / bandwidth) from the trace's expert unions."""
    w, r = ds2_points[1]
    m, hw = w.model, w.hw
    u = w.union[w.warmup:].sum(axis=1)
    byts = m.streamed_dense_params + u * m.expert_bytes + w.kv_total
    expect = len(u) / (byts / (hw.lpddr_bw_gbs * 1e9)).sum()
    assert r["xPU"].tokens_per_s == pytest.approx(expect, rel=1e-9)
    assert r["xPU"].bytes_per_token["lpddr"] == pytest.approx(byts.mean(), rel=1e-9)


def test_systems_sane(ds2_points):
    for b, (w, r) in ds2_points.items():
        for s, x in r.items():
            assert x.tokens_per_s > 0 and x.energy_per_token_mj > 0, (b, s)
        # HB systems beat LPDDR-only at batch 1; ELMoE-3D reports cache statistics
        assert r["HB-xPU"].tokens_per_s > r["xPU"].tokens_per_s
        c = r["ELMoE-3D"].cache
        assert 0 <= c["hit_rate"] <= c["belady_hit_rate"] + 1e-9 <= 1.0 + 1e-9
        assert len(c["per_layer_miss_rate"]) == len(w.sampled)
    e16 = ds2_points[16][1]["ELMoE-3D"]
    assert e16.mode == "SD" and 0.33 <= e16.acceptance["rate"] <= 0.91
    assert e16.bytes_per_token["hb_read"] > 0 and e16.bytes_per_token["lpddr"] > 0


def test_ablation_directions():
    """Hotness beats a random resident set and augmented beats truncated drafts."""
    w = Workload(get_model("Qwen3-30B-A3B"), get_hardware(), 8)
    h = run_system("ELMoE-3D", w, mode="SD", policy="hotness")
    r = run_system("ELMoE-3D", w, mode="SD", policy="random")
    t = run_system("ELMoE-3D", w, mode="SD", precision="truncated")
    assert h.acceptance["acceptance_length"] > r.acceptance["acceptance_length"]
    assert h.acceptance["rate"] > 3 * t.acceptance["rate"]
    assert h.tokens_per_s > t.tokens_per_s


def test_kv_squeezes_cache():
    m = get_model("Qwen3-30B-A3B")
    caches = [Workload(m, get_hardware(), 4, c).hb_split()[2] for c in (1024, 8192, 32768)]
    assert caches[0] > caches[1] > caches[2] == 0
    assert Workload(m, get_hardware(hb_gb=4), 4).hb_split()[2] < caches[0]


@pytest.mark.parametrize("call,msg", [
    (lambda: Workload(get_model("OLMoE-1B-7B"), get_hardware(), 0), "Batch must be an integer >= 1, not 0"),
    (lambda: Workload(get_model("Mixtral-8x7B"), get_hardware(hb_gb=1), 1), "smaller than the dense weights"),
    (lambda: get_hardware(hb_gb=-1), "HB capacity"),
    (lambda: run_system("TPU", Workload(get_model("OLMoE-1B-7B"), get_hardware(), 1)), "Unknown system"),
])
def test_bad_inputs(call, msg):
    with pytest.raises(ValueError, match=msg) as e:
        call()
    assert "\n" not in str(e.value)


def test_save_trace_batched_form(tmp_path):
    """(B, T, L, k) experts plus a metadata dict (how issue 7 calls it)."""
    e = np.random.default_rng(0).integers(0, 16, (3, 20, 4, 2))
    p = save_trace(tmp_path / "lm.npz", e, dict(source="lm", model="small", experts=16, top_k=2))
    t = load_trace(p)
    assert t.num_experts == 16 and t.requests == 3 and t.model == "small"
    assert np.array_equal(t.streams(3), e)


def test_real_trace_replay(tmp_path):
    """A trace from a smaller model (issue 7's format) replays on a published shape."""
    t = generate(4, 16, 2, requests=4, steps=40, seed=9, model="tiny-moe")
    p = save_trace(tmp_path / "tiny.npz", t, source="test")
    w = Workload(get_model("OLMoE-1B-7B"), get_hardware(), 2, trace=load_trace(p))
    assert any("mapped" in n for n in w.notes)
    r = run_system("ELMoE-3D", w)
    assert r.tokens_per_s > 0 and w.streams.max() < 16


# -- grid, report, CLI -----------------------------------------------------------------

def test_grid_ratios_and_side_by_side():
    g = run_grid(["OLMoE-1B-7B"], (1, 4))
    for p in g["points"]:
        r = p["results"]
        assert p["ratios"]["speedup_vs_xpu"] == pytest.approx(
            r["ELMoE-3D"]["tokens_per_s"] / r["xPU"]["tokens_per_s"])
        best = max(r[s]["tokens_per_s"] for s in ("xPU-PIM", "xPU-NMP", "HB-xPU"))
        assert p["ratios"]["speedup_vs_best_prior"] == pytest.approx(r["ELMoE-3D"]["tokens_per_s"] / best)
    rows = side_by_side(g)
    assert rows[0]["paper"] == 6.6 and rows[0]["model"] == pytest.approx(
        g["summary"]["all_models"]["speedup_vs_xpu"]["mean"])
    json.dumps(g)                                 # JSON-able


def test_locality_check_rows():
    r = locality_check(["OLMoE-1B-7B"], fractions=(0.25, 0.5), batches=(1, 16))
    row = r["rows"][0]
    assert row["hit_50pct_b1"] > row["hit_25pct_b1"]
    assert row["hit_50pct_b1"] > row["hit_50pct_b16"]          # batch destroys LRU locality


def test_cli_perf(tmp_path, capsys):
    from elmoe3d.cli import main
    t = generate(16, 64, 8, requests=2, steps=40, seed=4)
    trace = save_trace(tmp_path / "t.jsonl", t)
    out = tmp_path / "perf.json"
    rc = main(["perf", "--model", "OLMoE-1B-7B", "--batch", "1,2", "--json", str(out),
               "--plot", str(tmp_path / "plots"), "--trace", str(trace)])
    assert rc == 0
    g = json.loads(out.read_text())
    assert [p["batch"] for p in g["points"]] == [1, 2] and g["trace"].startswith("file")
    assert (tmp_path / "plots" / "speedup_vs_batch.png").stat().st_size > 1000
    assert "side by side" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["perf", "--model", "GPT-5"], "Unknown model 'GPT-5'"),
    (["perf", "--batch", "0"], "Batch must be a positive integer, not 0"),
    (["perf", "--model", "Mixtral-8x7B", "--hb-gb", "1"], "smaller than the dense weights"),
    (["perf", "--trace", "/nonexistent/t.npz"], "does not exist"),
])
def test_cli_bad_inputs(argv, msg, capsys):
    from elmoe3d.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_cli_malformed_trace(tmp_path, capsys):
    from elmoe3d.cli import main
    p = tmp_path / "bad.jsonl"
    p.write_text('{"format": "elmoe3d-trace"}\n{"experts": 3}\n')
    assert main(["perf", "--model", "OLMoE-1B-7B", "--batch", "1", "--trace", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Malformed trace file" in err[0]


def test_build_section(tmp_path):
    from elmoe3d.commands import perf
    from elmoe3d.config import preset
    from elmoe3d.report import BuildContext, Progress
    sec = perf.build_section(BuildContext(preset("default"), tmp_path, Progress(quiet=True), quick=True))
    assert "| speedup vs xPU, mean | 6.60x |" in sec.markdown
    assert "Why the numbers differ" in sec.markdown
    assert (tmp_path / "perf" / "speedup_vs_batch.png").exists()
    assert sec.data["side_by_side"][5]["model"] is not None      # hotness ablation ran


@pytest.mark.slow
def test_full_grid(tmp_path, capsys):
    """The whole default grid (6 models x batch 1..16 x 7 systems). Its wall
    time is reported, not asserted (shared machines are noisy); the README's
    figure comes from `elmoe3d perf --json`."""
    t0 = time.monotonic()
    g = run_grid()
    assert len(g["points"]) == 30
    with capsys.disabled():
        print(f"\nfull perf grid: {time.monotonic() - t0:.1f} s wall")


@pytest.mark.slow
def test_ablations_run():
    a = ablations(["Qwen3-30B-A3B"], batches=(4, 16))
    assert a["hotness"]["mean_gain"] > 0
    assert {r["hb_gb"] for r in a["hb"]["rows"]} == {4.0, 8.0}
    assert len(a["context"]["rows"]) == 6
