"""The synthesis, FPGA and IP flow: Yosys/nextpnr per block and its records, the generated tables and catalogue, timing, interface sheets, FuseSoC cores, lint, board self-tests, peers, sweeps."""
