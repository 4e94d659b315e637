//! The deterministic cluster simulation: the real ledger (`submit`, the sweeper, `verify`)
//! against a simulated CouchDB 3.4 cluster (`sim/`), one run per seed, every fault the seed
//! picks, an oracle after each run. Prints the `SIMULATION` line; a failing seed prints the
//! command that replays it.
//!
//! - `SIM_SEEDS=N` runs N seeds (default 300; `SIM_LONG_EVERY` of them are long runs with a
//!   node down for minutes); `SIM_SEED=S` replays one seed (decimal or `0x…`), `SIM_LONG=1`
//!   as a long run; `SIM_THREADS` (default 2); `SIM_TRIO=1` draws the trio's shape in every
//!   seed (docs/CLUSTER.md, "Open: reads of one copy"); `SIM_TWO_TERMS=0` leaves out one id
//!   resent with other terms, which every other run draws; `SIM_RECOVERY=1` draws the
//!   recovery shape in every short run (`=0`: in none; by default one in six);
//!   `SIM_PASS_LIMIT=N` makes every sweep pass look at N transfers and markers at most.
//! - After the seeds, a fifth of them again with sweep passes of one (`SIM_SMALL_PASS_SEEDS`),
//!   the steered runs (`sim/run/steered.rs`: one interleaving each, scripted where the seeds do
//!   not draw it; `SIM_STEERED=<name>` runs one alone), and a fifth of them in the trio's shape
//!   (`SIM_TRIO_SEEDS`; 0 leaves them out).

mod sim;

fn main() {
    std::process::exit(sim::main());
}
