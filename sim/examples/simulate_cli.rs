//! `tessera simulate` without the rest of the binary: the same flags and output, built from the simulator and the
//! core alone, so measuring a policy change over the scenario corpus rebuilds two crates instead of every role:
//! `cargo run --release -p tessera-sim --example simulate_cli -- --scenario scenarios/default.yaml --seeds 1-24`.

use std::process::ExitCode;

use clap::Parser;

/// The `simulate` subcommand's flags.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tessera_sim::simulate::Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(tessera_sim::simulate::run(cli.args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The `tessera` binary's report: `Error:` and each cause once, no backtrace under RUST_BACKTRACE=1
            // (returning the error from main would print anyhow's Debug form: the cause twice and the backtrace).
            eprintln!("{}", tessera_runtime::report::report(&e));
            ExitCode::FAILURE
        }
    }
}
