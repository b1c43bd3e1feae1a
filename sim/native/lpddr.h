// LPDDR stand-in of the native tile harness: an AXI4 read slave over a byte
// image, cycle for cycle the model of elmoe3d.tb.lpddr.LpddrModel (its
// Python twin, which the cocotb tile bench drives; tests/test_tile_native.py
// requires the two to give the same cycles). The rule, per clock cycle:
//
//   drive(n)  (after the clock edge that starts cycle n)
//     credit  = min(credit + bytes_per_cycle, beat_bytes)   (bandwidth metered
//               only when bytes_per_cycle > 0)
//     arready = fewer than `depth` bursts queued, and no AR pause (a draw)
//     if no beat is held: the head burst's next beat is presented (rvalid)
//       when its data is due (AR cycle + latency), there is no R pause (a
//       draw) and, metered, credit >= beat_bytes (then credit -= beat_bytes)
//   sample(n) (the outputs of cycle n, before the next edge)
//     arvalid & arready: a burst is queued, due at n + latency
//     rvalid & rready:   the beat is taken; the burst ends at its last beat
//
// Pauses are draws of the driver's splitmix64 generator (AR, then R, each
// only when its probability is not 0); the Python twin draws from the bench's
// generator, so the two agree cycle for cycle when the pauses are off.
//
// Faults follow the golden's rule (elmoe3d.golden.esd): the bursts inside the
// expert region form commands -- a burst starts a new command when its
// expert differs from the last burst's or its address is not above it -- and
// the first beat of command N's first burst is corrupted by faults[N]: RRESP
// SLVERR (1) / DECERR (2), or a wrong RLAST (3): early on a longer burst,
// missing on a one-beat one. Only expert reads count (the dense load does not).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

namespace elmoe {

// splitmix64: tiny and seedable
struct SplitMix {
    uint64_t s;
    explicit SplitMix(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // true with probability p (p == 0: no draw)
    bool chance(double p) {
        if (p <= 0.0) return false;
        return (double)(next() >> 11) * (1.0 / 9007199254740992.0) < p;
    }
};

struct LpddrParams {
    uint64_t base = 0;              // byte address of image[0]
    uint64_t expert_base = 0;       // first byte of the expert region
    uint64_t expert_end = 0;        // bursts below this count as expert reads
    uint64_t expert_bytes = 1;      // bytes of one expert's image
    uint32_t beat_bytes = 8;
    uint32_t latency = 1;           // AR handshake -> first beat's valid, >= 1
    uint32_t depth = 16;            // bursts queued at most
    uint32_t bytes_per_cycle = 0;   // 0: one beat per cycle
    double ar_pause = 0.0, r_pause = 0.0;
};

struct Beat {
    const uint8_t* data;            // beat_bytes bytes (nullptr: outside the image)
    uint32_t resp;
    bool last;
    uint32_t id;
};

class Lpddr {
  public:
    Lpddr(const LpddrParams& p, const std::vector<uint8_t>& image, SplitMix& rng,
          std::map<uint64_t, int> faults)
        : p_(p), image_(image), rng_(rng), faults_(std::move(faults)),
          credit_(p.beat_bytes), zero_(p.beat_bytes, 0) {}

    // inputs of the tile for cycle n
    void drive(uint64_t n) {
        (void)n;
        if (p_.bytes_per_cycle) {
            credit_ += p_.bytes_per_cycle;
            if (credit_ > p_.beat_bytes) credit_ = p_.beat_bytes;
        }
        bool ar_pause = rng_.chance(p_.ar_pause);
        bool r_pause = rng_.chance(p_.r_pause);
        arready = queue_.size() < p_.depth && !ar_pause;
        if (!held_ && !queue_.empty() && queue_.front().due <= n && !r_pause &&
            (!p_.bytes_per_cycle || credit_ >= p_.beat_bytes)) {
            if (p_.bytes_per_cycle) credit_ -= p_.beat_bytes;
            present();
        }
        rvalid = held_;
    }

    // outputs of the tile in cycle n
    void sample(uint64_t n, bool arvalid, uint64_t araddr, uint32_t arlen, uint32_t arid,
                bool rready) {
        if (held_ && rready) {
            held_ = false;
            Burst& b = queue_.front();
            if (++b.beat == b.len) queue_.pop_front();
            beats++;
        }
        if (arvalid && arready) accept(n, araddr, arlen + 1, arid);
    }

    bool arready = false, rvalid = false;
    Beat beat{nullptr, 0, false, 0};
    uint64_t bursts = 0, beats = 0;
    int64_t cmd = -1;                                   // expert command of the last burst
    std::vector<std::pair<int64_t, int>> corrupted;     // (command, fault kind)

  private:
    struct Burst {
        uint64_t addr;
        uint32_t len, beat, id;
        uint64_t due;
        int fault;                                      // 0: none
        int64_t cmd;                                    // its expert command (-1: none)
    };

    void accept(uint64_t n, uint64_t addr, uint32_t len, uint32_t id) {
        int fault = 0;
        int64_t mine = -1;
        if (addr >= p_.expert_base && addr < p_.expert_end) {
            uint64_t region = (addr - p_.expert_base) / p_.expert_bytes;
            bool first = !have_last_ || last_region_ != region || addr <= last_addr_;
            if (first) {
                cmd++;
                auto f = faults_.find((uint64_t)cmd);
                if (f != faults_.end()) fault = f->second;
            }
            mine = cmd;
            have_last_ = true;
            last_region_ = region;
            last_addr_ = addr;
        }
        queue_.push_back(Burst{addr, len, 0, id, n + p_.latency, fault, mine});
        bursts++;
    }

    void present() {
        const Burst& b = queue_.front();
        uint64_t a = b.addr + (uint64_t)b.beat * p_.beat_bytes;
        bool inside = a >= p_.base && a - p_.base + p_.beat_bytes <= image_.size();
        beat.data = inside ? image_.data() + (a - p_.base) : zero_.data();
        beat.resp = inside ? 0 : 3;                     // DECERR outside the image
        beat.last = b.beat + 1 == b.len;
        beat.id = b.id;
        if (b.beat == 0 && b.fault) {
            if (b.fault == 3) beat.last = !beat.last;
            else beat.resp = b.fault == 1 ? 2 : 3;      // SLVERR / DECERR
            corrupted.emplace_back(b.cmd, b.fault);
        }
        held_ = true;
    }

    LpddrParams p_;
    const std::vector<uint8_t>& image_;
    SplitMix& rng_;
    std::map<uint64_t, int> faults_;
    std::deque<Burst> queue_;
    bool held_ = false;
    uint32_t credit_;
    bool have_last_ = false;
    uint64_t last_region_ = 0, last_addr_ = 0;
    std::vector<uint8_t> zero_;
};

}  // namespace elmoe
