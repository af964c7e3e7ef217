//! `grpo-suite`: list cases, run trials, bless and check golden files, export inputs.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    if let Err(e) = cli::dispatch(args) {
        // One clear line (plus causes), never a panic backtrace.
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
