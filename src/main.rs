//! `grpo-suite`: list cases, run trials, bless and check golden files, export inputs.

mod cli;

use clap::Parser;

fn main() {
    // The XLA CPU plugin logs INFO lines through absl: keep warnings and errors unless the
    // user chose otherwise. Set before any thread exists (the environment is process-wide).
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    }
    // libtpu (tpu-aot) must not query a cloud metadata server on a machine that is not a
    // TPU VM; set before any thread exists.
    #[cfg(feature = "pjrt")]
    grpo_conformance::backends::pjrt::tpu_aot::prepare_environment();
    // A file-size limit (RLIMIT_FSIZE) makes a write fail with EFBIG, reported in one line,
    // instead of killing the process by SIGXFSZ half-way through a file.
    #[cfg(target_os = "linux")]
    // SAFETY: setting a signal's disposition to SIG_IGN before any thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // A closed pipe (`grpo-suite cases | head -1`) ends the program quietly, as it does
    // any Unix filter, instead of a panic in println!.
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::Cli::try_parse().unwrap_or_else(|e| cli::exit_on_parse_error(e));
    if let Err(e) = grpo_conformance::env::check_all() {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
    if let Err(e) = cli::dispatch(args) {
        // One clear line (plus causes), never a panic backtrace; the status says which end
        // (docs: README, "Exit status").
        eprintln!("error: {e:#}");
        std::process::exit(cli::exit_code(&e));
    }
}
