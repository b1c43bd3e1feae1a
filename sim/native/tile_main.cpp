// Native harness of the tile top elmoe3d_tile: the Verilated model clocked by
// this driver, no Python in the cycle loop (elmoe3d.sim.native builds and runs
// it; docs/blocks/tile.md, "Native harness").
//
//   tile_main PARAMS        PARAMS: "key value" lines (elmoe3d.sim.native.write_params)
//
// Input: the host command stream as packed TileCommand payloads (cmd_file,
// n_cmds x cmd_words little-endian 32-bit words) and the LPDDR image
// (mem_file, bytes from byte address mem_base). The driver sends every
// command in order (random idle cycles from the seed), takes every host_rsp
// and trace transfer (random back-pressure from the seed), serves the AXI4
// read port with the LPDDR model of lpddr.h, and stops `tail` cycles after
// the expect_rsp-th response (or at max_cycles, or after stall_limit cycles
// in which nothing moved). It only moves bit vectors:
// what a payload means is Python's business (the Amaranth layouts).
//
// Output (out_file, little-endian): a header of u64 values (see write_out),
// the cycle each command was taken, every response and trace event as
// (u64 cycle, payload words), the faults injected, and the end state of the
// observation outputs.
//
// Verilator escapes a double underscore in a port name: Amaranth's stream
// port host_cmd__payload is the model's host_cmd___05Fpayload.
//
// Timing is the cocotb benches': reset for 3 clock edges, then in cycle n
// (n = 1, 2, ... from the first edge after reset) inputs are driven after the
// edge and outputs sampled before the next one.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "Vtile.h"
#include "lpddr.h"
#include "verilated.h"

namespace {

// -- ports of any width: Verilator's CData/SData/IData (<= 32 bits), QData
// (<= 64) and VlWide<N> (N 32-bit words), as little-endian 32-bit words --------
inline void put(CData& p, const uint32_t* w) { p = (CData)w[0]; }
inline void put(SData& p, const uint32_t* w) { p = (SData)w[0]; }
inline void put(IData& p, const uint32_t* w) { p = w[0]; }
inline void put(QData& p, const uint32_t* w) { p = (QData)w[0] | ((QData)w[1] << 32); }
template <std::size_t N>
inline void put(VlWide<N>& p, const uint32_t* w) {
    for (std::size_t i = 0; i < N; i++) p[i] = w[i];
}
inline void get(const CData& p, uint32_t* w) { w[0] = p; }
inline void get(const SData& p, uint32_t* w) { w[0] = p; }
inline void get(const IData& p, uint32_t* w) { w[0] = p; }
inline void get(const QData& p, uint32_t* w) {
    w[0] = (uint32_t)p;
    w[1] = (uint32_t)(p >> 32);
}
template <std::size_t N>
inline void get(const VlWide<N>& p, uint32_t* w) {
    for (std::size_t i = 0; i < N; i++) w[i] = p[i];
}
// 32-bit words of a port type
template <class T>
struct Words {
    static constexpr std::size_t n = sizeof(T) <= 4 ? 1 : 2;
};
template <std::size_t N>
struct Words<VlWide<N>> {
    static constexpr std::size_t n = N;
};
template <class T>
constexpr std::size_t words_of() {
    return Words<std::remove_cv_t<std::remove_reference_t<T>>>::n;
}
#define WORDS(port) words_of<decltype(port)>()
// rdata from bytes (n of them, little-endian)
template <class T>
inline void put_bytes(T& p, const uint8_t* b, std::size_t n) {
    uint32_t w[WORDS(p)] = {};
    std::memcpy(w, b, n < sizeof w ? n : sizeof w);
    put(p, w);
}
inline uint64_t scalar(uint64_t v) { return v; }
template <std::size_t N>
inline uint64_t scalar(const VlWide<N>& v) {
    return (uint64_t)v[0] | (N > 1 ? (uint64_t)v[1] << 32 : 0);
}

struct Params {
    std::map<std::string, std::string> kv;
    explicit Params(const char* path) {
        std::ifstream f(path);
        if (!f) fail(std::string("cannot read the parameter file ") + path);
        std::string line;
        while (std::getline(f, line)) {
            std::istringstream s(line);
            std::string k, v;
            if (s >> k) {
                std::getline(s >> std::ws, v);
                kv[k] = v;
            }
        }
    }
    static void fail(const std::string& m) {
        std::fprintf(stderr, "tile_main: %s\n", m.c_str());
        std::exit(2);
    }
    const std::string& str(const std::string& k) const {
        auto i = kv.find(k);
        if (i == kv.end()) fail("parameter '" + k + "' missing");
        return i->second;
    }
    uint64_t u(const std::string& k, uint64_t d) const {
        auto i = kv.find(k);
        return i == kv.end() ? d : std::strtoull(i->second.c_str(), nullptr, 0);
    }
    double f(const std::string& k, double d) const {
        auto i = kv.find(k);
        return i == kv.end() ? d : std::strtod(i->second.c_str(), nullptr);
    }
};

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) Params::fail("cannot read " + path);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// "ordinal:kind,ordinal:kind"
std::map<uint64_t, int> parse_faults(const std::string& s) {
    std::map<uint64_t, int> out;
    std::istringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        auto c = item.find(':');
        if (c == std::string::npos) continue;
        out[std::strtoull(item.substr(0, c).c_str(), nullptr, 0)] =
            std::atoi(item.substr(c + 1).c_str());
    }
    return out;
}

// An output stream of the tile taken with random back-pressure; records
// (cycle, payload) of every transfer and counts stream-rule violations
// (valid dropped or payload changed while not taken).
template <class Payload>
struct Sink {
    static constexpr std::size_t nw = words_of<Payload>();
    CData& valid;
    CData& ready;
    Payload& payload;
    double bp;
    std::vector<uint32_t> rec;                  // per transfer: cycle lo, hi, payload words
    uint64_t count = 0, violations = 0;
    bool rdy = false, holding = false;
    std::vector<uint32_t> held, now;
    Sink(CData& v, CData& r, Payload& p, double bp_, std::size_t reserve)
        : valid(v), ready(r), payload(p), bp(bp_), held(nw), now(nw) {
        rec.reserve(reserve * (2 + nw));
    }
    void drive(elmoe::SplitMix& rng) {
        rdy = !rng.chance(bp);
        ready = rdy;
    }
    void sample(uint64_t cycle) {
        if (!valid) {
            if (holding) violations++;
            holding = false;
            return;
        }
        if (!rdy || holding) get(payload, now.data());
        if (holding && now != held) violations++;
        if (rdy) {
            holding = false;
            rec.push_back((uint32_t)cycle);
            rec.push_back((uint32_t)(cycle >> 32));
            std::size_t at = rec.size();
            rec.resize(at + nw);
            get(payload, rec.data() + at);
            count++;
        } else {
            holding = true;
            held = now;
        }
    }
};

double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

void write_u64(std::FILE* f, uint64_t v) { std::fwrite(&v, 8, 1, f); }

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) Params::fail("usage: tile_main PARAMS");
    Params P(argv[1]);
    auto ctx = std::make_unique<VerilatedContext>();
    ctx->fatalOnError(false);
    auto top = std::make_unique<Vtile>(ctx.get());

    // -- inputs -------------------------------------------------------------------------
    const std::size_t cw = WORDS(top->host_cmd___05Fpayload);
    if (P.u("cmd_words", 0) != cw)
        Params::fail("cmd_words " + P.str("cmd_words") + " but the model's host_cmd has " +
                     std::to_string(cw) + " words: a build of another configuration");
    std::vector<uint8_t> raw = read_file(P.str("cmd_file"));
    const uint64_t n_cmds = raw.size() / (4 * cw);
    std::vector<uint32_t> cmds(n_cmds * cw);
    std::memcpy(cmds.data(), raw.data(), cmds.size() * 4);
    std::vector<uint8_t> image = read_file(P.str("mem_file"));
    elmoe::LpddrParams lp;
    lp.base = P.u("mem_base", 0);
    lp.expert_base = P.u("expert_base", 0);
    lp.expert_end = P.u("expert_end", 0);
    lp.expert_bytes = P.u("expert_bytes", 1);
    lp.beat_bytes = (uint32_t)P.u("beat_bytes", 8);
    lp.latency = (uint32_t)P.u("latency", 1);
    lp.depth = (uint32_t)P.u("depth", 16);
    lp.bytes_per_cycle = (uint32_t)P.u("bytes_per_cycle", 0);
    lp.ar_pause = P.f("ar_pause", 0.0);
    lp.r_pause = P.f("r_pause", 0.0);
    if (lp.latency < 1) lp.latency = 1;
    if (WORDS(top->m_axi_rdata) * 4 < lp.beat_bytes)
        Params::fail("beat_bytes " + std::to_string(lp.beat_bytes) + " wider than m_axi_rdata");
    const double cmd_idle = P.f("cmd_idle", 0.0);
    const uint64_t expect = P.u("expect_rsp", 0), max_cycles = P.u("max_cycles", 1ull << 40);
    const uint64_t tail = P.u("tail", 50), progress = P.u("progress_every", 0);
    // a tile that stops moving (no command taken, no response, event or
    // LPDDR transfer) for this many cycles is stuck: the run ends there
    const uint64_t stall_limit = P.u("stall_limit", 1000000);
    elmoe::SplitMix rng(P.u("seed", 1));
    elmoe::Lpddr mem(lp, image, rng, parse_faults(P.kv.count("faults") ? P.str("faults") : ""));

    Sink<std::remove_reference_t<decltype(top->host_rsp___05Fpayload)>> rsp(top->host_rsp___05Fvalid, top->host_rsp___05Fready,
                                               top->host_rsp___05Fpayload, P.f("rsp_bp", 0.0),
                                               expect + 16);
    Sink<std::remove_reference_t<decltype(top->trace___05Fpayload)>> trace(top->trace___05Fvalid, top->trace___05Fready,
                                              top->trace___05Fpayload, P.f("trace_bp", 0.0),
                                              P.u("expect_trace", 1024) + 16);
    std::vector<uint64_t> taken;
    taken.reserve(n_cmds);

    // -- reset: 3 clock edges --------------------------------------------------------------
    top->clk = 0;
    top->rst = 1;
    top->host_cmd___05Fvalid = 0;
    top->host_rsp___05Fready = 0;
    top->trace___05Fready = 0;
    top->m_axi_arready = 0;
    top->m_axi_rvalid = 0;
    top->eval();
    for (int i = 0; i < 3; i++) {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        top->eval();
    }
    top->rst = 0;

    // -- the cycle loop -------------------------------------------------------------------
    const double t0 = cpu_seconds();
    uint64_t cyc = 0, next = 0, after = 0, moved = 0, seen = 0;
    bool item = false, fired = false, complete = false;
    while (cyc < max_cycles) {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        cyc++;
        // drive
        if (fired) item = false;
        if (!item && next < n_cmds && !rng.chance(cmd_idle)) {
            put(top->host_cmd___05Fpayload, cmds.data() + next * cw);
            item = true;
        }
        top->host_cmd___05Fvalid = item;
        rsp.drive(rng);
        trace.drive(rng);
        mem.drive(cyc);
        top->m_axi_arready = mem.arready;
        top->m_axi_rvalid = mem.rvalid;
        if (mem.rvalid) {
            put_bytes(top->m_axi_rdata, mem.beat.data, lp.beat_bytes);
            top->m_axi_rresp = mem.beat.resp;
            top->m_axi_rlast = mem.beat.last;
            top->m_axi_rid = mem.beat.id;
        }
        top->eval();
        // sample
        fired = item && top->host_cmd___05Fready;
        if (fired) {
            taken.push_back(cyc);
            next++;
        }
        rsp.sample(cyc);
        trace.sample(cyc);
        mem.sample(cyc, top->m_axi_arvalid, scalar(top->m_axi_araddr), top->m_axi_arlen,
                   top->m_axi_arid, top->m_axi_rready);
        const uint64_t now = next + rsp.count + trace.count + mem.beats + mem.bursts;
        if (now != seen) {
            seen = now;
            moved = cyc;
        } else if (cyc - moved > stall_limit) {
            break;
        }
        if (rsp.count >= expect) {
            if (++after > tail) {
                complete = true;
                break;
            }
        }
        if (progress && cyc % progress == 0) {
            std::fprintf(stdout, "cycle %llu responses %llu\n", (unsigned long long)cyc,
                         (unsigned long long)rsp.count);
            std::fflush(stdout);
        }
    }
    const double cpu = cpu_seconds() - t0;

    // -- output ---------------------------------------------------------------------------
    std::FILE* f = std::fopen(P.str("out_file").c_str(), "wb");
    if (!f) Params::fail("cannot write " + P.str("out_file"));
    const uint64_t state_words = WORDS(top->resident);
    const uint64_t head[] = {0x454c4d4f45334431ull,        // "ELMOE3D1"
                             1,                            // format version
                             cyc, complete, taken.size(), rsp.count, trace.count,
                             WORDS(top->host_rsp___05Fpayload), WORDS(top->trace___05Fpayload),
                             mem.bursts, mem.beats, mem.corrupted.size(), state_words,
                             rsp.violations + trace.violations,
                             (uint64_t)(cpu * 1e6)};
    for (uint64_t v : head) write_u64(f, v);
    std::fwrite(taken.data(), 8, taken.size(), f);
    std::fwrite(rsp.rec.data(), 4, rsp.rec.size(), f);
    std::fwrite(trace.rec.data(), 4, trace.rec.size(), f);
    for (auto& c : mem.corrupted) {
        write_u64(f, (uint64_t)c.first);
        write_u64(f, (uint64_t)c.second);
    }
    std::vector<uint32_t> w(state_words);
    for (auto* port : {&top->resident, &top->pending, &top->slot_valid, &top->covered}) {
        get(*port, w.data());
        std::fwrite(w.data(), 4, w.size(), f);
    }
    write_u64(f, top->fill_done_overflow);
    std::fclose(f);
    top->final();
    return 0;
}
