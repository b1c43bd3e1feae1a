"""The small MoE LM (issue 7): NumPy inference correctness on the committed
weights and a fast slice of the evidence measurements. No torch needed; the
logits-match test skips cleanly without it. Tests never train."""

import json
import math

import numpy as np
import pytest

from elmoe3d.golden import bitslice
from elmoe3d.golden import lm as glm
from elmoe3d.sim.lm import evidence as ev

pytestmark = pytest.mark.lm

#: stated bound: INT8 FULL (per-channel weight quantisation) perplexity within
#: this relative delta of float on held-out windows
INT8_PPL_DELTA = 0.02


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with glm.single_thread_blas():
        yield


@pytest.fixture(scope="module")
def wm():
    return glm.load_weights()


@pytest.fixture(scope="module")
def target(wm):
    return glm.MoEModel(*wm, "full")


def test_weights_checksum_and_shape(wm, tmp_path):
    w, meta = wm
    s = meta["shape"]
    assert w["embed"].shape == (s["vocab"], s["d_model"])
    assert w["l0.w_gate"].shape == (s["experts"], s["ffn"], s["d_model"])
    assert meta["reproduce"].startswith("python -m elmoe3d.sim.lm.train")
    want = (glm.DATA_DIR / "moe_lm.weights.sha256").read_text().split()[0]
    assert glm.weights_digest() == want
    # a corrupted copy is refused
    src = glm.DATA_DIR / glm.WEIGHTS
    bad = tmp_path / glm.WEIGHTS
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    (tmp_path / "moe_lm.sha256").write_text((glm.DATA_DIR / "moe_lm.sha256").read_text())
    with pytest.raises(ValueError, match="Checksum mismatch"):
        glm.load_weights(bad)


def test_quantisation_is_the_bitslice_model(wm):
    w = wm[0]["l1.w_down"][3]
    q, scale = glm.quantize(w)
    assert q.dtype == np.int8 and np.all(np.abs(q) <= 127)
    assert np.all(np.abs(q * scale[:, None] - w) <= scale[:, None] / 2 + 1e-7)
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, size=(5, w.shape[1]))
    for prec, mode in (("full", bitslice.Mode.FULL), ("augmented", bitslice.Mode.DRAFT),
                       ("truncated", bitslice.Mode.MSB)):
        eff = glm.effective_matrix(w, prec)
        # integer dot products of the effective INT8 weights == the golden bit-slice dot
        ints = np.rint(eff / scale[:, None]).astype(np.int64)
        ref = np.stack([bitslice.dot(ai, q, 4, mode, 1) for ai in a])
        assert np.array_equal(a @ ints.T, ref), prec
        # and the PE's field-by-field algorithm agrees on one row
        planes = bitslice.split(q[0], 4)
        n = planes.shape[0]
        seq = list(bitslice.plane_range(4, mode, 1))
        got = bitslice.pe_dot([a[0]] * len(seq), [planes[p] for p in seq], seq, 4, mode, 1)
        assert got == ref[0, 0] and n == 2
    with pytest.raises(ValueError, match="precision"):
        glm.effective_matrix(w, "int4")


def test_kv_cache_and_greedy_decoding(wm, target):
    prompts = ev.heldout_prompts(4)[:, :24]
    toks, routing, cache = target.generate(prompts, 12)
    assert toks.shape == (4, 36) and cache.length == 35
    logits, r2 = target.forward(toks[:, :-1])
    assert np.array_equal(np.argmax(logits[:, 23:], -1), toks[:, 24:])
    assert np.array_equal(routing.experts, r2.experts)
    # chunked forward through a cache == one forward
    c = target.new_cache(4, 35)
    a, _ = target.forward(toks[:, :10], c)
    b, _ = target.forward(toks[:, 10:35], c)
    assert np.allclose(np.concatenate([a, b], 1), logits, atol=2e-4)
    with pytest.raises(ValueError, match="capacity"):
        target.forward(toks[:, :2], c)


def test_routing_restricted_to_residents(wm, target):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, target.d)).astype(np.float32)
    res = np.zeros((64, target.E), bool)
    for i in range(64):
        res[i, rng.choice(target.E, 4, replace=False)] = True
    e, g, p = target.route(0, x, res)
    assert np.all(np.take_along_axis(res, e.astype(np.int64), -1))
    assert np.allclose(g.sum(-1), 1, atol=1e-5)
    # highest-ranked residents: no resident expert outside the choice scores higher
    logits = x @ target.layers[0]["router"]
    chosen_min = np.take_along_axis(logits, e.astype(np.int64), -1).min(-1)
    other = np.where(res, logits, -np.inf)
    np.put_along_axis(other, e.astype(np.int64), -np.inf, -1)
    assert np.all(other.max(-1) <= chosen_min)
    e0, _, _ = target.route(0, x)
    assert np.array_equal(e0[:, 0], np.argmax(logits, -1))


def test_full_precision_all_resident_draft_is_the_target(wm, target):
    """The draft machinery (own KV on top of the target's cache, several
    start positions at once) must reproduce the target exactly when nothing
    is restricted; any attention/cache/position error breaks this."""
    s = ev.Setup(n_prompts=6, gen_len=20, rounds=3, round_stride=3, max_draft=6, batch_groups=())
    prompts = ev.heldout_prompts(6)[:, :s.prompt_len]
    toks, routing, cache = target.generate(prompts, s.gen_len)
    starts = s.starts()
    res = np.ones((6, len(starts), target.L, target.E), bool)
    d = target.draft_rounds(cache, starts, toks[:, starts], res, s.max_draft)
    assert np.array_equal(ev.acceptance(d, toks, starts, s.max_draft), np.full((6, 3), 6))
    # a half-resident truncated draft differs somewhere (the check can fail)
    half = ev.resident_sets("random", 0.5, routing.experts, starts, target.E, s)
    dm = glm.MoEModel(*wm, "full", expert_precision="truncated")
    d2 = dm.draft_rounds(cache, starts, toks[:, starts], half, s.max_draft)
    assert not np.array_equal(d2, d)


def test_int8_perplexity_within_delta(wm):
    p = ev.perplexities(*wm, ev.heldout_windows(16), precisions=("float", "full"))
    assert abs(p["full"]["ppl"] / p["float"]["ppl"] - 1) < INT8_PPL_DELTA, p
    assert math.isclose(p["float"]["nats_per_byte"], math.log(p["float"]["ppl"]))


def test_torch_logits_match(wm):
    torch = pytest.importorskip("torch")
    from elmoe3d.sim.lm import train
    torch.manual_seed(0)
    m = train.load_numpy_into(train.build_model(wm[1]["shape"]), wm[0]).eval()
    idx = ev.heldout_prompts(2)
    with torch.no_grad():
        ref = m(torch.from_numpy(idx)).numpy()
    got, _ = glm.MoEModel(*wm, "float").forward(idx)
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())   # measured 1.6e-5 / 19


def test_routing_statistics_on_known_traces():
    E, k = 8, 2
    same = np.zeros((3, 10, 2, k), np.int16)
    same[..., 1] = 5
    probs = np.full((3, 10, 2, E), 1 / E, np.float32)
    st = ev.routing_stats(same, probs, E)
    assert st[0]["reuse"] == 1.0 and math.isclose(st[0]["skew"], E / 2)
    assert math.isclose(st[0]["token_entropy"], 1.0, rel_tol=1e-6)
    assert math.isclose(st[0]["pop_entropy"], math.log(2) / math.log(E), rel_tol=1e-9)
    ws = ev.working_set(same, E, batches=(1, 3))
    assert [w["distinct"] for w in ws] == [2.0, 2.0]
    rng = np.random.default_rng(0)
    rnd = np.stack([rng.permutation(E)[:k] for _ in range(16 * 50 * 1)]).reshape(16, 50, 1, k)
    ws = ev.working_set(rnd, E, batches=(1, 4, 16))
    assert ws[0]["distinct"] == k
    assert abs(ws[1]["distinct"] - ws[1]["uniform"]) < 0.3
    assert abs(ws[2]["distinct"] - ws[2]["uniform"]) < 0.3


def test_tag_unit_hotness_resident_sets():
    s = ev.Setup()
    rng = np.random.default_rng(5)
    ex = np.stack([rng.permutation(16)[:2] for _ in range(2 * 120 * 3)]).reshape(2, 120, 3, 2)
    ex[:, :, :, 0] = 7                       # expert 7 is always chosen: always resident
    starts = s.starts()
    res = ev.resident_sets("hotness", 0.25, ex, starts, 16, s)
    assert res.shape == (2, s.rounds, 3, 16) and np.all(res.sum(-1) == 4)
    assert np.all(res[..., 7])
    # the last token's experts were just touched or allocated: resident
    for j, st in enumerate(starts):
        assert np.all(np.take_along_axis(res[:, j], ex[:, st - 1].astype(np.int64), -1))
    rank = ev.resident_sets("hotness-rank", 0.5, ex, starts, 16, s)
    assert np.all(rank.sum(-1) == 8) and np.all(rank[..., 7])
    orc = ev.resident_sets("oracle", 0.25, ex, starts, 16, s)
    assert np.all(orc[..., 7]) and np.all(orc.sum(-1) == 4)
    assert np.all(ev.resident_sets("random", 1.0, ex, starts, 16, s))
    # a batch of 2 shares one cache: identical sets, still C per layer, hot 7 resident
    for pol in ("hotness", "hotness-rank", "random", "oracle"):
        g = ev.resident_sets(pol, 0.25, ex, starts, 16, s, group=2)
        assert np.array_equal(g[0], g[1]) and np.all(g.sum(-1) == 4), pol
    assert np.all(ev.resident_sets("hotness", 0.25, ex, starts, 16, s, group=2)[..., 7])
    with pytest.raises(ValueError, match="Batch group"):
        ev.resident_sets("random", 0.25, ex, starts, 16, s, group=3)
    with pytest.raises(ValueError, match="policy"):
        ev.resident_sets("lru", 0.5, ex, starts, 16, s)
    with pytest.raises(ValueError, match="beyond"):
        ev.resident_sets("hotness", 0.5, ex[:, :80], starts, 16, s)


def test_evidence_fast_slice(wm, tmp_path):
    s = ev.Setup(n_prompts=8, gen_len=24, rounds=3, round_stride=4, fractions=(0.5, 1.0),
                 policies=("hotness", "random"), ppl_windows=4, batch_groups=(4,),
                 batch_policies=("hotness", "random"),
                 variants=(ev.PRIMARY, (2, 1, "channel"), (4, 1, "tensor")), variant_fractions=(0.5, 1.0))
    acc = tmp_path / "acceptance.json"
    res = ev.run(s, weights_meta=wm, log=lambda m: None, trace_path=tmp_path / "trace.npz",
                 acceptance_path=acc)
    data = json.loads(acc.read_text())
    assert data["format"] == "elmoe3d-acceptance" and data["rows"] == res["acceptance_mean"]
    rows = res["acceptance"]
    keys = {"draft_len", "resident_fraction", "policy", "precision", "acceptance_rate",
            "mean_accepted", "slice_bits", "keep", "scales", "dense_precision", "overlap"}
    prim = [r for r in rows if (r["slice_bits"], r["keep"], r["scales"], r["dense_precision"])
            == (4, 1, "channel", "full") and r["precision"] != "rtn4"]
    assert len(prim) == 2 * 2 * 3 * s.max_draft
    for r in rows:
        assert set(r) == keys, r
        assert 0 <= r["acceptance_rate"] <= 1 and 0 <= r["overlap"] <= 1
        if r["resident_fraction"] == 1.0:
            assert r["overlap"] == 1.0
            if r["precision"] == "full":
                assert r["acceptance_rate"] == 1.0
    # 2-bit and per-tensor rows: truncated, augmented and FULL with hotness residents
    for v in ((2, 1, "channel"), (4, 1, "tensor")):
        for prec in ("truncated", "augmented", "full"):
            for f in (0.5, 1.0):
                assert any((r["slice_bits"], r["keep"], r["scales"], r["precision"], r["policy"],
                            r["resident_fraction"]) == v + (prec, "hotness", f) for r in rows), (v, prec, f)
    assert any(r["precision"] == "rtn4" for r in rows)
    assert any(r["dense_precision"] == "augmented" for r in rows)
    for pol in s.policies:
        for prec in s.precisions:
            m = [x["mean_accepted"] for x in prim if x["policy"] == pol
                 and x["precision"] == prec and x["resident_fraction"] == 0.5]
            assert m == sorted(m)            # E[min(L, m)] grows with L
    q = {(r["slice_bits"], r["keep"], r["scales"], r["precision"]): r for r in res["bit_axis"]}
    assert q[(2, 1, "channel", "truncated")]["ppl"] > q[(2, 1, "channel", "augmented")]["ppl"]
    assert q[(None, None, "channel", "full")]["agreement"] == 1.0
    e = res["precision_error"]["errors"]
    assert e["s2k1-channel-truncated"] > e["s2k1-channel-augmented"] > e["s4k1-channel-augmented"]
    assert {c["variant"] for c in res["bit_axis_claims"]} == {"s4k1-channel", "s2k1-channel", "s4k1-tensor"}
    assert res["trace"]["format"] in ("npz-fallback", "sim.perf.traces.save_trace")
    assert {r["batch"] for r in res["batched"]} == {4} and len(res["batched"]) == 2 * s.max_draft
    assert set(res["batched_ci"]) == {"1", "4"}
    assert len(res["routing"]) == wm[1]["shape"]["n_layers"]
    assert {r["policy"] for r in res["sd_loop"]} == {"hotness", "random"}
    for r in res["sd_loop"]:
        assert 0 <= r["mean_accepted"] <= s.sd_loop_draft
        if r["policy"] == "hotness":
            assert 0 <= r["draft_resident_rate"] <= 1
    assert res["acceptance_fit"]["rows"] > 0 and 0 < res["acceptance_fit"]["a_max"] <= 1


def test_evidence_across_two_trained_models():
    """Every conclusion is reported per model and as mean and spread across
    models (two committed models, a tiny slice)."""
    s = ev.Setup(n_prompts=4, gen_len=24, rounds=2, round_stride=4, fractions=(0.5, 1.0),
                 policies=("hotness", "random"), ppl_windows=2, batch_groups=(), sd_loop_draft=0,
                 variants=(ev.PRIMARY, (2, 1, "channel")), variant_fractions=(0.5, 1.0), dense_msb=False,
                 rtn4=False, models=("seed1234", "seed1"))
    res = ev.run(s, log=lambda m: None)
    assert [m["name"] for m in res["models"]] == ["seed1234", "seed1"]
    assert res["models"][0]["weights_sha256"] != res["models"][1]["weights_sha256"]
    a = res["across_models"]["hotness_vs_random"]
    v = list(a["values"].values())
    assert len(v) == 2 and a["mean"] == pytest.approx(np.mean(v)) and a["std"] == pytest.approx(np.std(v, ddof=1))
    assert set(a["ci95_within"]) == {"seed1234", "seed1"}
    mr = res["acceptance_mean"]
    assert all(r["models"] == 2 for r in mr) and any("mean_accepted_std" in r for r in mr)
    with pytest.raises(ValueError, match="Unknown trained model"):
        ev.Setup(models=("seed99",))


def test_overlap_and_fit_on_known_data():
    res = np.zeros((1, 1, 1, 4), bool)
    res[..., :2] = True                                   # experts 0, 1 resident
    experts = np.array([[[[0, 2]], [[1, 0]], [[3, 2]]]], np.int16)     # [B=1, T=3, L=1, k=2]
    ov = ev.overlap_by_len(res, experts, np.array([0]), 3)
    assert ov.tolist() == [0.5, 0.75, 0.5]
    # rows generated from the model form are fitted back
    rng = np.random.default_rng(0)
    rows, errs = [], {"s4k1-channel-augmented": 0.1, "s4k1-channel-truncated": 0.3, "s2k1-channel-truncated": 0.8}
    for name, e in errs.items():
        sb, kp = int(name[1]), int(name[3])
        for o in rng.uniform(0.3, 1.0, 20):
            a = 0.95 * o ** 0.7 * np.exp(-2.5 * e * e)
            for L in (1, 4, 8):
                rows.append(dict(draft_len=L, resident_fraction=o, policy="hotness",
                                 precision=name.split("-")[-1], overlap=o, slice_bits=sb, keep=kp,
                                 scales="channel", dense_precision="full",
                                 mean_accepted=sum(a ** i for i in range(1, L + 1)), acceptance_rate=a))
    fit = ev.fit_acceptance(rows, errs)
    assert fit["a_max"] == pytest.approx(0.95, abs=0.01) and fit["beta"] == pytest.approx(0.7, abs=0.02)
    assert fit["gamma"] == pytest.approx(2.5, abs=0.05) and fit["rmse"] < 0.01


def test_bit_slice_variants_are_the_golden_model(wm):
    """Every variant's effective weights are the golden bit-slice dot products
    of the INT8 weights (per channel or per tensor); 2-bit slices keeping 2
    planes are the same 4-bit draft as 4-bit slices keeping 1."""
    w = wm[0]["l2.w_up"][5]
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, size=(4, w.shape[1]))
    for sc in glm.SCALES:
        q, scale = glm.quantize(w, sc)
        if sc == "tensor":
            assert np.allclose(scale, scale[0])
        for sb, keep in ((4, 1), (2, 1), (2, 2), (2, 3)):
            for prec, mode in (("augmented", bitslice.Mode.DRAFT), ("truncated", bitslice.Mode.MSB)):
                eff = glm.effective_matrix(w, prec, sb, keep, sc)
                ints = np.rint(eff / scale[:, None]).astype(np.int64)
                assert np.array_equal(a @ ints.T, np.stack([bitslice.dot(x, q, sb, mode, keep) for x in a]))
    for prec in ("augmented", "truncated"):
        assert np.array_equal(glm.effective_matrix(w, prec, 2, 2), glm.effective_matrix(w, prec, 4, 1))
    r4 = glm.effective_matrix(w, "rtn4")
    assert max(len(np.unique(row)) for row in r4) <= 15
    with pytest.raises(ValueError, match="scales"):
        glm.quantize(w, "row")


def test_sd_loop_all_resident_full_accepts_everything(wm, target):
    s = ev.Setup(n_prompts=4, gen_len=24, rounds=3, batch_groups=())
    toks, routing, cache = target.generate(ev.heldout_prompts(4)[:, :s.prompt_len], s.gen_len)
    r = ev.sd_loop(target, cache, toks, routing.experts, s, 1.0, "random", 4)
    assert r["mean_accepted"] == 4.0 and r["bytes_per_iteration"] == 5.0
    # feeds at 63, 68, ..., while 4 more target bytes exist after the fed one
    per_prompt = len(range(s.prompt_len - 1, toks.shape[1] - 4, 5))
    assert r["iterations"] == 4 * per_prompt


def test_committed_acceptance_table():
    """The acceptance file the system model reads: the design-point grid, the
    2-bit and per-tensor rows, the measured draft-weight errors and the fit."""
    data = json.loads((ev.DATA_DIR / ev.ACCEPTANCE).read_text())
    rows = data["rows"]
    keys = {(r["draft_len"], r["resident_fraction"], r["policy"], r["precision"]) for r in rows
            if (r["slice_bits"], r["keep"], r["scales"], r["dense_precision"]) == (4, 1, "channel", "full")}
    for L in range(1, 9):
        for f in (0.25, 0.5, 0.75, 1.0):
            for pol in ("hotness", "random", "oracle"):
                for prec in ("truncated", "augmented", "full"):
                    assert (L, f, pol, prec) in keys
    for v in ev.VARIANTS:
        for prec in ("truncated", "augmented", "full"):
            assert any((r["slice_bits"], r["keep"], r["scales"], r["precision"], r["policy"]) ==
                       v + (prec, "hotness") for r in rows), (v, prec)
    assert len(data["models"]) >= 4 and all(r["models"] == len(data["models"]) for r in rows)
    e = data["precision_error"]
    assert e["s2k1-channel-truncated"] > e["s2k1-channel-augmented"] and "rtn4" in e
    assert 0 < data["fit"]["a_max"] <= 1 and data["fit"]["rows"] > 1000


def test_committed_models_reproduce_the_perplexity_not_the_bits():
    """Four committed trained models (seed 1234 and three more seeds): each
    passes its checksum, each has its own weights, and their validation
    perplexities agree to a few per cent (retraining reproduces the
    perplexity, not the bits)."""
    paths = glm.model_paths()
    assert len(paths) >= 4 and "seed1234" in paths
    ppl, dig = [], set()
    for name, p in paths.items():
        w, meta = glm.load_weights(p)
        assert meta["train"]["seed"] == (1234 if name == "seed1234" else int(name[4:]))
        want = (p.parent / "moe_lm.weights.sha256").read_text().split()[0]
        assert glm.weights_digest(p) == want
        dig.add(want)
        ppl.append(meta["val_ppl"])
    assert len(dig) == len(paths)
    assert max(ppl) / min(ppl) < 1.05, ppl


def test_cli_rejects_bad_values():
    from elmoe3d.cli import main
    assert main(["evidence", "--quick", "--prompts", "0"]) == 2
    assert main(["evidence", "--quick", "--models", "seed99"]) == 2
    with pytest.raises(ValueError, match="Bit-slice variant"):
        ev.Setup(variants=((2, 4, "channel"),))
    with pytest.raises(ValueError, match="Resident fraction"):
        ev.Setup(fractions=(0.0,))
    with pytest.raises(ValueError, match="gen_len"):
        ev.Setup(gen_len=8)


def test_report_section_and_verdicts(tmp_path):
    """The report reads the cached full run; verdicts follow the numbers."""
    from elmoe3d.commands import evidence as cmd
    from elmoe3d.config import preset
    from elmoe3d.report import BuildContext, Progress
    sec = cmd.build_section(BuildContext(preset("tiny"), tmp_path, Progress(quiet=True)))
    res = json.loads((ev.DATA_DIR / cmd.CACHE).read_text())
    assert sec.data == res and "Hotness vs random" in sec.markdown
    assert res["setup"]["n_prompts"] >= 200 and len(res["models"]) >= 4
    assert "The bit axis: 2-bit slices" in sec.markdown and "Across training runs" in sec.markdown
    assert "Bit axis, 2-bit slices, keep the top plane" in sec.markdown
    # swap hotness and random: the claim must now be reported as not holding
    flipped = json.loads(json.dumps(res))
    h = flipped["claims"]["hotness_vs_random"]
    h["hotness"], h["random"] = h["random"], h["hotness"]
    h["gain"] = h["hotness"] / h["random"] - 1
    flipped["claims_ci"]["hotness_vs_random"]["ci95"] = [h["gain"] - 0.01, h["gain"] + 0.01]
    text = "\n".join(cmd.verdicts(flipped))
    assert "Hotness vs random residents (~+22% accepted length in the paper): DOES NOT HOLD" in text


def test_quant_study_lm_rows(tmp_path):
    """`elmoe3d quant` covers s = 2 (keep 1, 2, 3) and s = 4, per channel and
    per tensor, on the LM: perplexity, agreement and the evidence's acceptance."""
    from elmoe3d.sim.lm.quant_study import lm_bit_axis
    from elmoe3d.cli import main
    ev_cache = json.loads((ev.DATA_DIR / ev.RESULT).read_text())
    lm = lm_bit_axis(2, evidence=ev_cache)
    got = {(r["s"], r["k"], r["scales"], r["scheme"]) for r in lm["rows"]}
    assert got == {v + (p,) for v in ev.VARIANTS for p in ("truncated", "augmented")}
    by = {(r["s"], r["k"], r["scales"], r["scheme"]): r for r in lm["rows"]}
    assert by[(2, 1, "channel", "truncated")]["ppl"] > 2 * by[(2, 1, "channel", "augmented")]["ppl"]
    assert all(0 <= r["agreement"] <= 1 and r["accepted_100pct_L8"] is not None for r in lm["rows"])
    out = tmp_path / "q.json"
    assert main(["quant", "--json", str(out), "--no-real", "--lm-windows", "2"]) == 0
    assert len(json.loads(out.read_text())["lm"]["rows"]) == 2 * len(ev.VARIANTS)
    assert main(["quant", "--lm-windows", "0"]) == 2
