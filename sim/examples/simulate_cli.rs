//! `tessera simulate` without the rest of the binary: the same flags and output, built from the simulator and the
//! core alone, so measuring a policy change over the scenario corpus rebuilds two crates instead of every role:
//! `cargo run --release -p tessera-sim --example simulate_cli -- --scenario scenarios/default.yaml --seeds 1-24`.

use clap::Parser;

/// The `simulate` subcommand's flags.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tessera_sim::simulate::Args,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(tessera_sim::simulate::run(cli.args))
}
