//! The `infergate` binary: one executable, several roles (see `infergate --help`).
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use infergate_engine::args::EngineArgs;

/// Inference gateway and smart load balancer for LLM serving.
#[derive(Parser)]
#[command(name = "infergate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one engine worker (OpenAI-compatible API, vLLM metrics).
    Engine(EngineArgs),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Engine(args) => runtime.block_on(infergate_engine::server::serve(args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
